"""The ``topics`` workload: topics created and deleted by concurrent
clients while test brokers register, heartbeat and are fenced and unfenced
(:class:`TopicsWorkload`), and its final check (:func:`check_final_metadata`).

The workload registers ``brokers`` test brokers (ids 1, 2, ...; recorded as
``register-broker`` ops) and keeps them heartbeating in the background (the
routine heartbeats are not recorded).  Now and then one broker asks to be
fenced (a recorded ``heartbeat`` with ``{"fence": true}``), stops
heartbeating for a moment and resumes (a recorded ``heartbeat`` with
``{"fence": false}``, which unfences it).  ``concurrency`` workers create
topics of unique names (1 to 3 partitions, a replication factor no larger
than the brokers known to be registered and unfenced) and delete topics
created earlier.  The history rules of the register workload hold: invoke
before, completion after; a timeout or an indeterminate answer is ``info``
and retires the process; a definite refusal is ``fail`` with an error word
(``docs/history-format.md``, model ``topics``).

The history's client ops name their target in ``key``: the topic of a
``create-topic`` or ``delete-topic``, the broker id (decimal) of a
``register-broker`` or ``heartbeat``.  Each topic name is created at most
once.  After the run, a linearizable read of the topics and the registered
brokers is compared with the history:

- a topic whose creation was ``ok`` and of which no delete was ``ok`` or
  ``info`` must exist (``lost-topic``);
- a topic that exists must have had a create invoked that did not ``fail``
  (``phantom-topic``), and no ``ok`` delete (``resurrected-topic``);
- a broker whose registration was ``ok`` must be registered
  (``lost-broker``), and a registered broker must have had a registration
  invoked that did not ``fail`` (``phantom-broker``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal

from chaos.workloads import (
    FinalVerdict,
    Pacer,
    WorkloadStats,
    error_word,
    sleep_unless_stopped,
)
from history.ops import NEMESIS, HistoryRecorder, Op, next_process
from metadata.client import (
    Endpoint,
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NewTopic,
    NoControllerError,
    SupportedFeature,
    error_code,
)
from metadata.controller import SUPPORTED_FEATURES
from metadata.errors import Errors

__all__ = ["FS", "MetadataProblem", "TopicsWorkload", "check_final_metadata"]

FS: Final = ("create-topic", "delete-topic", "register-broker", "heartbeat")
"""The ``f`` values of the ``topics`` model."""


@dataclass(frozen=True, slots=True)
class MetadataProblem:
    """One disagreement of the final metadata with the history."""

    kind: str
    target: str
    message: str


def _outcomes(ops: Sequence[Op], f: str) -> dict[str, set[str]]:
    """Completion types of the ops ``f`` by key."""
    out: dict[str, set[str]] = {}
    for op in ops:
        if op.process != NEMESIS and op.f == f and op.key is not None:
            out.setdefault(op.key, set())
            if op.type != "invoke":
                out[op.key].add(op.type)
    return out


def check_final_metadata(
    ops: Sequence[Op], topics: Collection[str], brokers: Collection[int]
) -> list[MetadataProblem]:
    """What in the final ``topics`` and registered ``brokers`` the history
    ``ops`` cannot explain; empty if everything agrees."""
    out: list[MetadataProblem] = []
    created = _outcomes(ops, "create-topic")
    deleted = _outcomes(ops, "delete-topic")
    present = set(topics)
    for name in sorted(created):
        gone = deleted.get(name, set()) & {"ok", "info"}
        if "ok" in created[name] and not gone and name not in present:
            out.append(
                MetadataProblem("lost-topic", name, f"topic {name} was created ok but is missing")
            )
    for name in sorted(present):
        kinds = created.get(name)
        if kinds is None or kinds == {"fail"}:
            why = "no create of it was invoked" if kinds is None else "every create of it failed"
            out.append(MetadataProblem("phantom-topic", name, f"topic {name} exists but {why}"))
        elif "ok" in deleted.get(name, set()):
            out.append(
                MetadataProblem(
                    "resurrected-topic", name, f"topic {name} exists but was deleted ok"
                )
            )
    registered = _outcomes(ops, "register-broker")
    live = {str(b) for b in brokers}
    for broker in sorted(registered, key=_broker_order):
        if "ok" in registered[broker] and broker not in live:
            out.append(
                MetadataProblem(
                    "lost-broker", broker, f"broker {broker} registered ok but is not registered"
                )
            )
    for broker in sorted(live, key=_broker_order):
        kinds = registered.get(broker)
        if kinds is None or kinds == {"fail"}:
            why = "no registration was invoked" if kinds is None else "every registration failed"
            message = f"broker {broker} is registered but {why}"
            out.append(MetadataProblem("phantom-broker", broker, message))
    return out


def _broker_order(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (-1, key)


# -- the workload --------------------------------------------------------------

CompletionType = Literal["ok", "fail", "info"]
Outcome = tuple[CompletionType, str | None]
"""A completion's type and error word."""


def _unknown(exc: IndeterminateError) -> Outcome:
    """A write that may have been applied: ``timeout`` if the client stopped
    waiting, ``indeterminate`` if the controller could not tell."""
    return "info", "timeout" if exc.timed_out else "indeterminate"


def _refused(exc: MetadataClientError) -> Outcome:
    """A definite refusal (no effect): ``unavailable`` when no active
    controller was found (nothing was sent)."""
    if isinstance(exc, NoControllerError):
        return "fail", "unavailable"
    return "fail", error_word(exc.code)


def _item(code: int) -> Outcome:
    """The outcome of one item of a write that was answered."""
    error = error_code(code)
    return ("ok", None) if error is Errors.NONE else ("fail", error_word(error))


class _Lane:
    """One worker (a topic worker or a test broker) and its current process."""

    def __init__(self, lane: int, client: MetadataClient, broker: int | None = None) -> None:
        self.process = lane
        self.client = client
        self.broker = broker
        self.counter = 0
        # A broker's registration: its epoch once registered ok, and
        # whether its last heartbeat left it fenced.
        self.epoch: int | None = None
        self.fenced = True


ClientFactory = Callable[[], MetadataClient]
BrokerClientFactory = Callable[[int], MetadataClient]

_NOT_REGISTERED: Final = frozenset({"stale-broker-epoch", "broker-id-not-registered"})
"""Heartbeat refusals after which a broker registers again."""


class TopicsWorkload:
    """Runs the topics workload and records it.

    ``open_client`` opens a :class:`MetadataClient` (one per process);
    ``open_broker_client(id)`` one for a test broker's lifecycle calls,
    which over TLS must present that broker's own certificate (default:
    ``open_client``); ``nodes`` maps node ids to the addresses it uses (to name the node that
    answered).  ``rate`` is the target of topic operations per second over
    the ``concurrency`` topic workers; ``brokers`` test brokers heartbeat
    every ``heartbeat_s`` and one of them is fenced about every
    ``fence_every_s`` for ``fence_s``.  ``op_timeout_s`` is how long an op
    may take before it counts as timed out (the client's deadline should be
    shorter).

    Use :meth:`run`, then :meth:`final`, then :meth:`close`.
    """

    def __init__(
        self,
        recorder: HistoryRecorder,
        open_client: ClientFactory,
        rng: random.Random,
        *,
        nodes: Mapping[int, str] | None = None,
        concurrency: int = 5,
        rate: float = 20.0,
        brokers: int = 3,
        op_timeout_s: float = 5.0,
        heartbeat_s: float = 0.5,
        fence_every_s: float = 3.0,
        fence_s: float = 1.0,
        final_timeout_s: float = 15.0,
        open_broker_client: BrokerClientFactory | None = None,
    ) -> None:
        if concurrency < 1 or brokers < 1:
            raise ValueError("concurrency and brokers must be at least 1")
        if min(rate, op_timeout_s, heartbeat_s, fence_every_s, fence_s, final_timeout_s) <= 0:
            raise ValueError("rates and durations must be positive")
        self.recorder = recorder
        self.open_client = open_client
        self.open_broker_client: BrokerClientFactory = open_broker_client or (
            lambda _broker: open_client()
        )
        self.rng = rng
        self.concurrency = concurrency
        self.rate = rate
        self.broker_count = brokers
        self.op_timeout_s = op_timeout_s
        self.heartbeat_s = heartbeat_s
        self.fence_every_s = fence_every_s
        self.fence_s = fence_s
        self.final_timeout_s = final_timeout_s
        self.stats = WorkloadStats()
        self.ops: list[Op] = []
        self._ids = {address: node for node, address in (nodes or {}).items()}
        self._lanes = concurrency + brokers
        self._workers: list[_Lane] = []
        self._brokers: list[_Lane] = []
        # One incarnation (a Uuid) for every broker and registration: a
        # registration that is tried again is then accepted.
        self._incarnation = base64.urlsafe_b64encode(rng.randbytes(16)).rstrip(b"=").decode()
        self._deletable: list[str] = []
        self._fencing = False
        self._cluster = ""
        self._stop = asyncio.Event()

    # -- lanes and recording -----------------------------------------------

    def _ensure_lanes(self) -> None:
        if not self._workers:
            self._workers = [_Lane(i, self.open_client()) for i in range(self.concurrency)]
            self._brokers = [
                _Lane(self.concurrency + i, self.open_broker_client(i + 1), broker=i + 1)
                for i in range(self.broker_count)
            ]

    @property
    def processes(self) -> list[int]:
        """The current process of each topic worker, then of each broker."""
        return [lane.process for lane in (*self._workers, *self._brokers)]

    def _unfenced(self) -> int:
        return sum(1 for b in self._brokers if b.epoch is not None and not b.fenced)

    async def _retire(self, lane: _Lane) -> None:
        old = lane.client
        lane.process = next_process(lane.process, self._lanes)
        lane.client = (
            self.open_client() if lane.broker is None else self.open_broker_client(lane.broker)
        )
        self.stats.retired += 1
        await old.close()

    async def _perform(
        self,
        lane: _Lane,
        f: str,
        key: str,
        value: Any,
        call: Callable[[MetadataClient], Awaitable[Outcome]],
    ) -> Op:
        """Record the invoke, make the call, record its completion; an
        ``info`` retires the lane's process."""
        process = lane.process
        self.ops.append(self.recorder.invoke(process, f, key=key, value=value))
        self.stats.invokes += 1
        client = lane.client
        try:
            type_, error = await asyncio.wait_for(call(client), self.op_timeout_s)
        except TimeoutError:
            type_, error = "info", "timeout"
        except IndeterminateError as exc:
            type_, error = _unknown(exc)
        except MetadataClientError as exc:
            type_, error = _refused(exc)
        address = client.controller_address
        node = None if address is None else self._ids.get(address)
        op = self.recorder.complete(process, type_, error=error, node=node)
        self.ops.append(op)
        self.stats.completions[type_] += 1
        if type_ == "info":
            await self._retire(lane)
        return op

    # -- topic operations ------------------------------------------------------

    async def _create(self, lane: _Lane) -> Op:
        lane.counter += 1
        name = f"t{lane.process}-{lane.counter}"
        partitions = self.rng.randint(1, 3)
        rf = self.rng.randint(1, max(1, min(3, self._unfenced())))

        async def call(client: MetadataClient) -> Outcome:
            r = await client.create_topics([NewTopic(name, partitions, rf)])
            return _item(r.topics[0].error)

        value = {"partitions": partitions, "replication_factor": rf}
        op = await self._perform(lane, "create-topic", name, value, call)
        if op.type != "fail":
            self._deletable.append(name)
        return op

    async def _delete(self, lane: _Lane, name: str) -> Op:
        async def call(client: MetadataClient) -> Outcome:
            r = await client.delete_topics([name])
            return _item(r.topics[0].error)

        return await self._perform(lane, "delete-topic", name, None, call)

    async def _topic_op(self, lane: _Lane) -> Op:
        if self._deletable and self.rng.random() < 0.4:
            name = self._deletable.pop(self.rng.randrange(len(self._deletable)))
            return await self._delete(lane, name)
        return await self._create(lane)

    # -- brokers -------------------------------------------------------------------

    async def _register(self, lane: _Lane) -> Op:
        assert lane.broker is not None
        broker = lane.broker
        request: dict[str, Any] = {
            # Read as a topic worker (the admin): a broker's certificate is
            # for its own lifecycle calls.
            "cluster_id": await self._cluster_id(
                self._workers[0].client if self._workers else lane.client
            ),
            "incarnation_id": self._incarnation,
            "endpoints": [Endpoint("PLAINTEXT", "127.0.0.1", 19_000 + broker)],
            "features": [
                SupportedFeature(name, low, high)
                for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
            ],
        }

        async def call(client: MetadataClient) -> Outcome:
            r = await client.register_broker(broker, **request)
            lane.epoch, lane.fenced = r.broker_epoch, True
            return "ok", None

        value = {"incarnation": self._incarnation}
        return await self._perform(lane, "register-broker", str(broker), value, call)

    async def _cluster_id(self, client: MetadataClient) -> str:
        """The cluster's id (a read: not recorded; empty if none answered)."""
        if not self._cluster:
            with contextlib.suppress(MetadataClientError):
                answer = await client.describe_cluster(linearizable=False)
                self._cluster = answer.cluster_id
        return self._cluster

    async def _heartbeat(self, lane: _Lane, *, fence: bool, record: bool) -> None:
        assert lane.broker is not None and lane.epoch is not None
        broker, epoch = lane.broker, lane.epoch

        async def call(client: MetadataClient) -> Outcome:
            # The test broker claims to have applied the log up to its
            # registration record (the end offset just past it): caught up.
            r = await client.broker_heartbeat(broker, epoch, epoch + 1, want_fence=fence)
            lane.fenced = r.is_fenced
            return "ok", None

        if record:
            op = await self._perform(lane, "heartbeat", str(broker), {"fence": fence}, call)
            if op.error in _NOT_REGISTERED:
                lane.epoch = None
            return
        try:
            await asyncio.wait_for(call(lane.client), self.op_timeout_s)
        except MetadataClientError as exc:
            if error_word(exc.code) in _NOT_REGISTERED:
                lane.epoch = None  # register again
        except (IndeterminateError, TimeoutError):
            pass  # not recorded: the next heartbeat tries again

    async def _broker_loop(self, lane: _Lane) -> None:
        fence_p = self.heartbeat_s / self.fence_every_s
        while not self._stop.is_set():
            if lane.epoch is None:
                await self._register(lane)
            elif not self._fencing and self.rng.random() < fence_p:
                self._fencing = True
                try:
                    await self._heartbeat(lane, fence=True, record=True)
                    await self._sleep(self.fence_s)
                    # Heartbeats resume (even when the run is ending, so
                    # that no broker is left fenced on purpose).
                    if lane.epoch is not None:
                        await self._heartbeat(lane, fence=False, record=True)
                finally:
                    self._fencing = False
            else:
                await self._heartbeat(lane, fence=False, record=False)
            await self._sleep(self.heartbeat_s)

    # -- phases ----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to end."""
        self._stop.set()

    async def _sleep(self, seconds: float) -> None:
        await sleep_unless_stopped(self._stop, seconds)

    async def run(self, time_limit_s: float, op_limit: int | None = None) -> WorkloadStats:
        """The main phase: the brokers register and heartbeat, the workers
        create and delete topics until ``time_limit_s`` passed, ``op_limit``
        topic ops were invoked, or :meth:`stop`.  Ops still running then get
        up to ``op_timeout_s`` and are cancelled (left in flight for the
        recorder's close)."""
        self._ensure_lanes()
        self._stop.clear()
        pacer = Pacer(self._stop, self.rng, self.concurrency, self.rate, time_limit_s, op_limit)

        async def work(lane: _Lane) -> None:
            # A moment for the brokers to register first.
            start = time.monotonic()
            while self._unfenced() == 0 and time.monotonic() - start < min(5.0, time_limit_s / 4):
                await self._sleep(0.05)
            await pacer.drive(partial(self._topic_op, lane))

        workers = [asyncio.create_task(work(lane)) for lane in self._workers]
        brokers = [asyncio.create_task(self._broker_loop(lane)) for lane in self._brokers]
        try:
            done, _ = await asyncio.wait(workers, timeout=time_limit_s + self.op_timeout_s + 1)
            self._stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*brokers, return_exceptions=True), self.op_timeout_s
                )
        finally:
            self._stop.set()
            for t in (*workers, *brokers):
                t.cancel()
            await asyncio.gather(*workers, *brokers, return_exceptions=True)
        for t in (*done, *brokers):
            exc = None if t.cancelled() else t.exception()
            if exc is not None:
                raise exc
        return self.stats

    async def final(self) -> FinalVerdict:
        """Read every topic and registered broker (linearizable) and check
        them against the history (:func:`check_final_metadata`)."""
        client = self.open_client()
        try:
            topics = await client.describe_topics(timeout_s=self.final_timeout_s)
            cluster = await client.describe_cluster(timeout_s=self.final_timeout_s)
        except MetadataClientError as exc:
            check = {"ok": False, "error": f"the final read failed: {exc}", "problems": []}
            return FinalVerdict(f"final check: {check['error']}", check, ok=False)
        finally:
            await client.close()
        names = sorted(t.name for t in topics.topics if error_code(t.error) is Errors.NONE)
        brokers = sorted(b.broker_id for b in cluster.brokers)
        problems = check_final_metadata(self.ops, names, brokers)
        check = {
            "ok": not problems,
            "topics": len(names),
            "brokers": brokers,
            "problems": [
                {"kind": p.kind, "target": p.target, "message": p.message} for p in problems
            ],
        }
        verdict = "ok" if not problems else f"{len(problems)} problem(s)"
        return FinalVerdict(
            f"final check: {len(names)} topics, brokers {brokers}: {verdict}",
            check,
            ok=not problems,
        )

    async def close(self) -> None:
        """Close every lane's client."""
        for lane in (*self._workers, *self._brokers):
            await lane.client.close()

"""The ``register`` workload: a linearizable compare-and-set register per key.

``concurrency`` workers each run one operation at a time (a linearizable
read, a write or a compare-and-set, chosen from an injected
:class:`random.Random`) against a few keys, at a target overall rate, and
record every operation with a :class:`~history.ops.HistoryRecorder` exactly as
``docs/history-format.md`` says for the ``register`` model:

- the invoke is recorded before the request is sent, the completion after
  the answer (or the timeout);
- every written value is unique per key (``v<process>-<n>``);
- an ``ok`` write or cas carries the ``offset`` and ``epoch`` of its record,
  an ``ok`` read those of the write whose value it returned;
- a write or cas whose outcome is unknown (timed out, or the server said
  indeterminate) completes as ``info`` and retires its process: the worker
  goes on as :func:`~history.ops.next_process`, with a new client;
- a read that times out or fails is ``fail`` (a read has no effect);
- a cas that found another value is ``fail`` with error ``precondition``;
- definite refusals are ``fail`` with the documented error words;
- no operation is retried: trying again is a new operation with a new value.

The client side is behind :class:`RegisterClient`, so that the same workload
runs over the metadata controller's conditional config updates
(:class:`ConfigRegisterClient`: the registers are cluster configs) or over
the quorum's own key-value store (:class:`KvRegisterClient`).  A client
turns each answer into a :class:`Completion`; the workload records it.

Clients follow the leader by default.  With ``pinned`` clients
(:class:`PinnedKvRegisterClient`), each process is bound to one node, as
Jepsen binds its clients (process ``p`` to the ``p mod n``-th node), and
never goes elsewhere: a node that does not lead refuses (``not-leader``),
and a node that wrongly believes it leads (a deposed leader cut off from
the others) is still asked, which is what exposes a read served without
the read barrier (Raft thesis §6.4).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, Protocol, cast

import grpc

from chaos.workloads import FinalVerdict, Pacer, WorkloadStats, error_word, run_workers
from history.ops import HistoryRecorder, Op, next_process
from kqproto import kv_pb2, kv_pb2_grpc
from kvstore.client import KvClient
from metadata.client import (
    ConfigOp,
    ConfigResource,
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NoControllerError,
    error_code,
)
from metadata.errors import Errors
from quorum.driver.client import (
    ChannelPool,
    ClientError,
    IndeterminateWriteError,
    NoLeaderError,
    ReadDeadlineError,
    ServerBusyError,
)

__all__ = [
    "CONFIG_REGISTER_KEYS",
    "Completion",
    "ConfigRegisterClient",
    "KvRegisterClient",
    "PinnedKvRegisterClient",
    "RegisterClient",
    "RegisterWorkload",
    "WorkloadStats",
    "config_value",
    "default_value",
    "pinned_kv_clients",
]

CompletionType = Literal["ok", "fail", "info"]
FS = ("read", "write", "cas")


@dataclass(frozen=True, slots=True)
class Completion:
    """How one operation ended, as a history completion records it.

    ``value`` is the value a read returned (``None``: the key holds none);
    writes and cas completions repeat their invoke's value, so it is unused
    for them.  ``node`` is the id of the node that answered, when known.
    """

    type: CompletionType
    error: str | None = None
    value: str | None = None
    node: int | None = None
    offset: int | None = None
    epoch: int | None = None


class RegisterClient(Protocol):
    """One worker's connection to the cluster.  Each method sends its request
    at most once where it may take effect (following definite refusals such
    as not-leader is allowed) and answers with a :class:`Completion`; it
    raises nothing but :class:`asyncio.CancelledError`."""

    async def read(self, key: str) -> Completion: ...

    async def write(self, key: str, value: str) -> Completion: ...

    async def cas(self, key: str, expected: str | None, new: str) -> Completion: ...

    async def close(self) -> None: ...


ClientFactory = Callable[[], RegisterClient]
"""Opens a new client (one per process: a retired process's client is
closed and its worker opens another)."""

ProcessClientFactory = Callable[[int], RegisterClient]
"""Opens a new client for the process given (a client bound to the node of
that process, :func:`pinned_kv_clients`)."""


# -- kq's key-value store ------------------------------------------------------


def _write_unknown(exc: IndeterminateWriteError) -> Completion:
    """A write that may have landed: ``timeout`` if the client stopped
    waiting, ``indeterminate`` if the server could not tell."""
    return Completion("info", "timeout" if exc.timed_out else "indeterminate")


def _write_refused(exc: ClientError) -> Completion:
    """A definite refusal of a write: no effect."""
    if isinstance(exc, NoLeaderError):
        return Completion("fail", "unavailable")
    if isinstance(exc, ServerBusyError):
        return Completion("fail", "throttling")
    return Completion("fail", "invalid-request")


class KvRegisterClient:
    """:class:`RegisterClient` over kq's key-value store (:class:`KvClient`).

    ``nodes`` maps node ids to client addresses; values are stored as UTF-8.
    ``timeout_s`` is each request's deadline; ``credentials`` what it presents (mutual TLS).
    """

    def __init__(
        self,
        nodes: Mapping[int, str],
        timeout_s: float = 2.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._ids = {address: node for node, address in nodes.items()}
        self._client = KvClient(list(nodes.values()), timeout_s=timeout_s, credentials=credentials)

    def _node(self, address: str | None) -> int | None:
        return None if address is None else self._ids.get(address)

    async def read(self, key: str) -> Completion:
        try:
            r = await self._client.get(key, linearizable=True)
        except ReadDeadlineError:
            return Completion("fail", "timeout")
        except ClientError:
            return Completion("fail", "invalid-request")
        node = self._node(r.node_address)
        if not r.present or r.value is None or r.version is None:
            return Completion("ok", value=None, node=node)
        return Completion(
            "ok",
            value=r.value.decode("utf-8"),
            node=node,
            offset=r.version.offset,
            epoch=r.version.epoch,
        )

    async def write(self, key: str, value: str) -> Completion:
        try:
            pos = await self._client.put(key, value.encode("utf-8"))
        except IndeterminateWriteError as exc:
            return _write_unknown(exc)
        except ClientError as exc:
            return _write_refused(exc)
        node = self._node(self._client.leader_address)
        return Completion("ok", node=node, offset=pos.offset, epoch=pos.epoch)

    async def cas(self, key: str, expected: str | None, new: str) -> Completion:
        try:
            out = await self._client.cas(
                key, None if expected is None else expected.encode("utf-8"), new.encode("utf-8")
            )
        except IndeterminateWriteError as exc:
            return _write_unknown(exc)
        except ClientError as exc:
            return _write_refused(exc)
        node = self._node(self._client.leader_address)
        pos = out.position
        if not out.ok:
            return Completion("fail", "precondition", node=node, offset=pos.offset, epoch=pos.epoch)
        return Completion("ok", node=node, offset=pos.offset, epoch=pos.epoch)

    async def close(self) -> None:
        await self._client.close()


class PinnedKvRegisterClient:
    """:class:`RegisterClient` over kq's key-value store bound to one node
    (``nodes[node]``), as Jepsen binds each client: every request goes to
    that node and nowhere else, and a refusal is not followed to the leader.

    Answers: a node that does not lead refuses (``fail`` ``not-leader``, no
    effect); a linearizable read is served by a node that believes it leads
    only once its read barrier confirmed it (a deposed leader's barrier
    times out: ``fail`` ``timeout``); no connection before the deadline
    means nothing was sent (``fail`` ``unavailable``); a write whose call
    broke after it was sent, or that the node could not settle, may have
    landed (``info``).  ``timeout_s`` is each request's deadline;
    ``credentials`` what it presents (mutual TLS)."""

    def __init__(
        self,
        nodes: Mapping[int, str],
        node: int,
        timeout_s: float = 2.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if node not in nodes:
            raise ValueError(f"node {node} is not one of the nodes {sorted(nodes)}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.node = node
        self.timeout_s = timeout_s
        self._channels = ChannelPool(credentials)
        self._channel = self._channels.get(nodes[node])
        self._stub = kv_pb2_grpc.KvServiceStub(self._channel)

    async def _connected(self, deadline: float) -> bool:
        """Whether the connection to the node is up by ``deadline`` (nothing
        is sent); false at once when it is refused (a dead node)."""
        loop = asyncio.get_running_loop()
        state = self._channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                return False
            budget = deadline - loop.time()
            if budget <= 0:
                return False
            try:
                await asyncio.wait_for(self._channel.wait_for_state_change(state), budget)
            except TimeoutError:
                return False
            state = self._channel.get_state(try_to_connect=True)
        return True

    async def read(self, key: str) -> Completion:
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        if not await self._connected(deadline):
            return Completion("fail", "unavailable", node=self.node)
        left = max(0.001, deadline - asyncio.get_running_loop().time())
        try:
            r: kv_pb2.GetResponse = await self._stub.Get(
                kv_pb2.GetRequest(key=key, linearizable=True), timeout=left
            )
        except grpc.aio.AioRpcError as exc:
            # A read has no effect: however it broke, it failed.
            if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
                return Completion("fail", "invalid-request", node=self.node)
            return Completion("fail", "timeout", node=self.node)
        if r.error == kv_pb2.NOT_LEADER:
            return Completion("fail", "not-leader", node=self.node)
        if r.error == kv_pb2.TIMEOUT:
            return Completion("fail", "timeout", node=self.node)
        if r.error != kv_pb2.OK:
            return Completion("fail", "invalid-request", node=self.node)
        if not r.present:
            return Completion("ok", value=None, node=self.node)
        return Completion(
            "ok",
            value=r.value.decode("utf-8"),
            node=self.node,
            offset=r.version.offset,
            epoch=r.version.epoch,
        )

    async def _write(self, call: str, request: Any) -> Completion | kv_pb2.WriteResponse:
        """The node's answer to a write, or the completion of a write that
        got none (refused before sending, or broken after it)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        if not await self._connected(deadline):
            return Completion("fail", "unavailable", node=self.node)
        left = max(0.001, deadline - asyncio.get_running_loop().time())
        try:
            response: kv_pb2.WriteResponse = await getattr(self._stub, call)(request, timeout=left)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # refused before appending
                return Completion("fail", "throttling", node=self.node)
            if code in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.PERMISSION_DENIED,
            ):
                return Completion("fail", "invalid-request", node=self.node)
            timed_out = code == grpc.StatusCode.DEADLINE_EXCEEDED
            return Completion("info", "timeout" if timed_out else "indeterminate", node=self.node)
        if response.error == kv_pb2.NOT_LEADER:
            return Completion("fail", "not-leader", node=self.node)
        if response.error == kv_pb2.INDETERMINATE:
            return Completion("info", "indeterminate", node=self.node)
        if response.error == kv_pb2.INVALID_REQUEST:
            return Completion("fail", "invalid-request", node=self.node)
        if response.error not in (kv_pb2.OK, kv_pb2.PRECONDITION_FAILED):
            # An answer no write is documented to get: it may have landed.
            return Completion("info", "indeterminate", node=self.node)
        return response

    async def write(self, key: str, value: str) -> Completion:
        r = await self._write("Put", kv_pb2.PutRequest(key=key, value=value.encode("utf-8")))
        if isinstance(r, Completion):
            return r
        return Completion("ok", node=self.node, offset=r.position.offset, epoch=r.position.epoch)

    async def cas(self, key: str, expected: str | None, new: str) -> Completion:
        request = kv_pb2.CasRequest(
            key=key,
            expected=b"" if expected is None else expected.encode("utf-8"),
            expect_absent=expected is None,
            value=new.encode("utf-8"),
        )
        r = await self._write("Cas", request)
        if isinstance(r, Completion):
            return r
        pos = r.position
        if r.error == kv_pb2.PRECONDITION_FAILED:
            return Completion(
                "fail", "precondition", node=self.node, offset=pos.offset, epoch=pos.epoch
            )
        return Completion("ok", node=self.node, offset=pos.offset, epoch=pos.epoch)

    async def close(self) -> None:
        await self._channels.close()


def pinned_kv_clients(
    nodes: Mapping[int, str],
    timeout_s: float = 2.0,
    credentials: grpc.ChannelCredentials | None = None,
) -> ProcessClientFactory:
    """Jepsen's binding of processes to nodes: process ``p`` gets a
    :class:`PinnedKvRegisterClient` of the ``p mod n``-th node (by id), so
    the workers of one run spread over every node, and a retired process's
    successor (``p + concurrency``) keeps its node when the concurrency is a
    multiple of the node count."""
    order = sorted(nodes)
    if not order:
        raise ValueError("pinned clients need at least one node")

    def open_client(process: int) -> RegisterClient:
        return PinnedKvRegisterClient(
            nodes, order[process % len(order)], timeout_s=timeout_s, credentials=credentials
        )

    return open_client


# -- the metadata controller's cluster configs -------------------------------------

CONFIG_REGISTER_KEYS: Final = (
    "log.retention.ms",
    "log.retention.bytes",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.cleaner.delete.retention.ms",
    "log.segment.delete.delay.ms",
    "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.compaction.lag.ms",
)
"""Cluster-level configs that serve as registers: longs that accept any value
from 1 up and that the controller itself never reads (changing them changes
nothing but the metadata), so the workload cannot disturb the cluster."""


def config_value(process: int, n: int) -> str:
    """The ``n``-th value written by ``process``, unique per run: a decimal
    long (every register config accepts it) that names its writer."""
    if n >= 1_000_000:
        raise ValueError(f"process {process} wrote a millionth value; values would repeat")
    return str(1_000_000_000 + process * 1_000_000 + n)


class ConfigRegisterClient:
    """:class:`RegisterClient` over the metadata controller's cluster configs:
    the key is a config name of :data:`CONFIG_REGISTER_KEYS`; a write is an
    AlterConfigs SET, a cas one with a condition (``expected`` or absent),
    a read a linearizable DescribeConfigs of the cluster.

    An ``ok`` write or cas carries the position where its ConfigRecord
    committed (AlterConfigs answers with it); a refused cas wrote nothing and
    carries none.  Reads carry no version: DescribeConfigs does not say which
    record set a value."""

    def __init__(
        self,
        nodes: Mapping[int, str],
        timeout_s: float = 2.0,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._ids = {address: node for node, address in nodes.items()}
        self._client = MetadataClient(
            list(nodes.values()), timeout_s=timeout_s, credentials=credentials
        )

    def _node(self) -> int | None:
        address = self._client.leader_address
        return None if address is None else self._ids.get(address)

    async def read(self, key: str) -> Completion:
        try:
            r = await self._client.describe_configs([ConfigResource.cluster()])
        except NoControllerError:
            return Completion("fail", "timeout")
        except MetadataClientError as exc:
            return Completion("fail", error_word(exc.code))
        (result,) = r.results
        if error_code(result.error) is not Errors.NONE:
            return Completion("fail", error_word(error_code(result.error)))
        found = {e.name: e.value for e in result.entries}
        return Completion("ok", value=found.get(key), node=self._node())

    async def _alter(self, op: ConfigOp) -> Completion:
        try:
            r = await self._client.alter_configs({ConfigResource.cluster(): [op]})
        except IndeterminateError as exc:
            return Completion("info", "timeout" if exc.timed_out else "indeterminate")
        except NoControllerError:
            return Completion("fail", "unavailable")
        except MetadataClientError as exc:
            return Completion("fail", error_word(exc.code))
        (result,) = r.results
        error = error_code(result.error)
        if error is Errors.CONFIG_PRECONDITION_FAILED:
            return Completion("fail", "precondition", node=self._node())
        if error is not Errors.NONE:
            return Completion("fail", error_word(error), node=self._node())
        if not r.HasField("position"):
            # Unique values always change the config; an ok without a record
            # would be a server bug the history must show, not hide.
            return Completion("ok", node=self._node())
        return Completion("ok", node=self._node(), offset=r.position.offset, epoch=r.position.epoch)

    async def write(self, key: str, value: str) -> Completion:
        return await self._alter(ConfigOp(key, value))

    async def cas(self, key: str, expected: str | None, new: str) -> Completion:
        return await self._alter(
            ConfigOp(key, new, expected=expected, expect_absent=expected is None)
        )

    async def close(self) -> None:
        await self._client.close()


# -- the workload --------------------------------------------------------------


def default_value(process: int, n: int) -> str:
    """The ``n``-th value written by ``process``: ``v<process>-<n>``."""
    return f"v{process}-{n}"


class _Worker:
    def __init__(self, lane: int, client: RegisterClient) -> None:
        self.lane = lane
        self.process = lane
        self.client = client
        self.counter = 0


class RegisterWorkload:
    """Runs the register workload and records it.

    ``open_client`` opens a :class:`RegisterClient` (one per process); with
    ``per_process`` it is a :data:`ProcessClientFactory`, given the process
    the client is for (:func:`pinned_kv_clients` binds it to a node).
    ``keys`` are the registers; ``weights`` the relative frequency of
    ``read``, ``write`` and ``cas``; ``rate`` the target of operations per
    second over all workers (each worker waits a random time, on average
    ``concurrency / rate`` seconds, before each op); ``op_timeout_s`` how
    long the workload waits for a client's answer before it counts the op as
    timed out (the client's own deadline should be shorter); ``make_value``
    the ``n``-th value of a process (unique per run; :func:`default_value`,
    or :func:`config_value` for the config store).

    Use :meth:`run` for the main phase, then :meth:`final_reads` (or
    :meth:`final`), then
    :meth:`close`.  Ops cut short by cancellation stay in flight in the
    recorder, whose close completes them as ``info`` (``run-ended``).
    """

    def __init__(
        self,
        recorder: HistoryRecorder,
        open_client: ClientFactory | ProcessClientFactory,
        rng: random.Random,
        *,
        per_process: bool = False,
        concurrency: int = 5,
        keys: Sequence[str] = ("k0", "k1", "k2"),
        rate: float = 50.0,
        weights: Mapping[str, float] | None = None,
        op_timeout_s: float = 5.0,
        make_value: Callable[[int, int], str] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not keys or len(set(keys)) != len(keys):
            raise ValueError("keys must be distinct and not empty")
        if rate <= 0:
            raise ValueError("rate must be positive")
        w = {"read": 1.0, "write": 1.0, "cas": 1.0, **(weights or {})}
        if set(w) != set(FS) or any(v < 0 for v in w.values()) or sum(w.values()) <= 0:
            raise ValueError(f"weights are non-negative numbers for {', '.join(FS)}")
        self.recorder = recorder
        self.open_client = open_client
        self.per_process = per_process
        self.rng = rng
        self.concurrency = concurrency
        self.keys = list(keys)
        self.rate = rate
        self.weights = [w[f] for f in FS]
        self.op_timeout_s = op_timeout_s
        self.make_value = make_value or default_value
        self.stats = WorkloadStats()
        self._workers: list[_Worker] = []
        # The value each key was last seen holding (a cas expects it).
        self._seen: dict[str, str | None] = {}
        self._stop = asyncio.Event()

    # -- workers -------------------------------------------------------------

    def _open(self, process: int) -> RegisterClient:
        if self.per_process:
            return cast(ProcessClientFactory, self.open_client)(process)
        return cast(ClientFactory, self.open_client)()

    def _ensure_workers(self) -> None:
        if not self._workers:
            self._workers = [_Worker(i, self._open(i)) for i in range(self.concurrency)]

    @property
    def processes(self) -> list[int]:
        """The current process of each worker."""
        return [w.process for w in self._workers]

    async def _retire(self, worker: _Worker) -> None:
        """The process got info: the worker continues as a new process with
        a new client."""
        old = worker.client
        worker.process = next_process(worker.process, self.concurrency)
        worker.counter = 0
        worker.client = self._open(worker.process)
        self.stats.retired += 1
        await old.close()

    def _value(self, worker: _Worker) -> str:
        worker.counter += 1
        return self.make_value(worker.process, worker.counter)

    def _choose(self, worker: _Worker) -> tuple[str, str, Any]:
        f = self.rng.choices(FS, weights=self.weights)[0]
        key = self.rng.choice(self.keys)
        if f == "read":
            return f, key, None
        if f == "write":
            return f, key, self._value(worker)
        # Mostly the value last seen (likely to succeed), sometimes absent.
        expected = self._seen.get(key) if self.rng.random() < 0.8 else None
        return f, key, [expected, self._value(worker)]

    async def execute(self, worker_or_lane: int, f: str, key: str, value: Any = None) -> Op:
        """Perform one op by a worker (given by its lane, 0 to concurrency-1)
        and record it: invoke, request, completion.  Returns the completion.
        ``value`` is the invoke's value: ``None`` for a read, the new value
        for a write, ``[expected, new]`` for a cas."""
        self._ensure_workers()
        worker = self._workers[worker_or_lane]
        return await self._perform(worker, f, key, value)

    async def _perform(self, worker: _Worker, f: str, key: str, value: Any) -> Op:
        if f not in FS:
            raise ValueError(f"the register workload has no f {f!r}")
        process = worker.process
        self.recorder.invoke(process, f, key=key, value=value)
        self.stats.invokes += 1
        client = worker.client
        if f == "read":
            call = client.read(key)
        elif f == "write":
            call = client.write(key, value)
        else:
            call = client.cas(key, value[0], value[1])
        try:
            c = await asyncio.wait_for(call, self.op_timeout_s)
        except TimeoutError:
            c = Completion("fail" if f == "read" else "info", "timeout")
        if f == "read":
            op = self.recorder.complete(
                process,
                c.type,
                value=c.value if c.type == "ok" else None,
                error=c.error,
                node=c.node,
                offset=c.offset,
                epoch=c.epoch,
            )
        else:
            op = self.recorder.complete(
                process, c.type, error=c.error, node=c.node, offset=c.offset, epoch=c.epoch
            )
        self.stats.completions[c.type] += 1
        if c.type == "ok":
            self._seen[key] = c.value if f == "read" else (value if f == "write" else value[1])
        if c.type == "info":
            await self._retire(worker)
        return op

    # -- phases --------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to end: workers start no new op."""
        self._stop.set()

    async def run(self, time_limit_s: float, op_limit: int | None = None) -> WorkloadStats:
        """The main phase: until ``time_limit_s`` passed, ``op_limit`` ops
        were invoked, or :meth:`stop`.  Then no new op starts; ops in flight
        get up to ``op_timeout_s`` to finish, and any still running are
        cancelled (left in flight for the recorder's close)."""
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

        async def op(worker: _Worker) -> None:
            f, key, value = self._choose(worker)
            await self._perform(worker, f, key, value)

        await run_workers(
            (pacer.drive(partial(op, w)) for w in self._workers),
            time_limit_s + self.op_timeout_s + 1,
        )
        return self.stats

    async def final_reads(self) -> list[Op]:
        """Read every key once, the keys shared out over the workers (a
        worker whose process still has an op in flight continues as a new
        process).  With ``per_process`` clients (bound to nodes, of which
        only the leader's answer) every worker reads every key.  Returns a
        read of each key, in key order: an ``ok`` one if any."""
        self._ensure_workers()
        in_flight = self.recorder.in_flight()
        for worker in self._workers:
            if worker.process in in_flight:
                await self._retire(worker)
        lanes: dict[int, list[str]] = {}
        if self.per_process:
            lanes = {lane: list(self.keys) for lane in range(self.concurrency)}
        else:
            for i, key in enumerate(self.keys):
                lanes.setdefault(i % self.concurrency, []).append(key)

        async def reads(worker: _Worker, keys: list[str]) -> list[Op]:
            return [await self._perform(worker, "read", key, None) for key in keys]

        results = await asyncio.gather(
            *(reads(self._workers[lane], keys) for lane, keys in lanes.items())
        )
        by_key: dict[str | None, Op] = {}
        for op in (op for ops in results for op in ops):
            if op.key not in by_key or (op.type == "ok" and by_key[op.key].type != "ok"):
                by_key[op.key] = op
        return [by_key[key] for key in self.keys]

    async def final(self) -> FinalVerdict:
        """:meth:`final_reads`, for the runner (a register run has no check
        of its own: the history is checked afterwards)."""
        reads = await self.final_reads()
        return FinalVerdict(
            "final reads: "
            + ", ".join(f"{op.key}={op.value if op.type == 'ok' else op.type}" for op in reads)
        )

    async def close(self) -> None:
        """Close every worker's client."""
        for worker in self._workers:
            await worker.client.close()

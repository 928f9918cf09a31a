"""Hypothesis fuzzing of every unary method of every service on a node.

A real 3-node controller quorum (the quorum, the key-value store and the
metadata services on each node) runs on mutual TLS in a background event
loop.  The methods are enumerated from the generated descriptors of every
``kqproto`` module, so a new method, or a new service, is fuzzed without a
change here; the test checks the node serves exactly those services.
Requests are built by Hypothesis from the message descriptors (every field
optional; extreme and edge integers, unknown enum values, long strings and
bytes, many repeated items, nested messages; the fields that route a Raft
request (cluster id, sender, addressee, epochs) often right), or are random
bytes.  They are sent by:

- ``plaintext``: no certificate, so no handshake;
- ``user``: a user's certificate without any ACL;
- ``controller-9``: a controller's certificate of a node that is not a
  voter, whose requests claim any sender, voters included;
- ``broker-7``: a broker's certificate;
- ``admin``: a super user's certificate, whose requests may do anything.

After every example (a batch of requests): no call ended UNKNOWN or
INTERNAL (a servicer that raised), nothing was logged at ERROR, every node
runs and answers DescribeQuorum, a leader exists and the cluster commits a
write.  For the callers that may not change state (plaintext, the user
without ACLs, the controller that is not a voter) the stored state of every
node is unchanged: its epoch, leader and vote (in memory and on disk), its
log end and applied offsets, the digest of its state and the metadata image;
for the broker, which may register itself, the epoch, leader and vote, and
the image's topics, configs, features and ACLs.

Bounded: ``KQ_FUZZ_EXAMPLES`` examples per caller (default 60) and at most
``KQ_FUZZ_BUDGET_S`` seconds of sending per caller (default 45).  On a
failure the test prints ``KQ_FUZZ_SEED`` to replay the run, and Hypothesis
the failing example.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import pkgutil
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import hypothesis.strategies as st
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, seed, settings

import kqproto
from kqproto import quorum_pb2, quorum_pb2_grpc
from kvstore.client import KvClient
from metadata.active import ControllerSettings
from quorum.config import QuorumConfig
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.node import NodeOptions
from quorum.driver.tls import dial
from quorum.types import MAX_EPOCH
from server.controller import plugin_of
from tests.driver.cluster_util import CLUSTER_ID
from tests.driver.test_acl_enforcement import ADMIN, TlsMetadataCluster

EXAMPLES = int(os.environ.get("KQ_FUZZ_EXAMPLES", "60"))
# Each caller's examples come from SEED + its place in CALLERS: fixed under
# the default (derandomized, repeatable) profile, random under ``deep``; set
# KQ_FUZZ_SEED to replay a run (the seed is printed with any failure).
_DEFAULT_SEED = 0 if settings().derandomize else random.randrange(2**32)
SEED = int(os.environ.get("KQ_FUZZ_SEED", str(_DEFAULT_SEED)))
BUDGET_S = float(os.environ.get("KQ_FUZZ_BUDGET_S", "45"))
RPC_S = 3.0
BROKER_ID = 7
OUTSIDER = 9  # a controller certificate's id that is no voter

# Small limits, so that Hypothesis reaches them cheaply.
MAX_ITEMS = 1000
MAX_MESSAGE = 512 * 1024
OPTIONS = NodeOptions(
    quorum=QuorumConfig(
        election_timeout_ms=1000,
        fetch_timeout_ms=3000,
        fetch_max_wait_ms=100,
        request_timeout_ms=500,
        fetch_max_bytes=256 * 1024,
        snapshot_chunk_bytes=64 * 1024,
    ),
    snapshot_every_offsets=0,
    max_batch_bytes=256 * 1024,
    max_message_bytes=MAX_MESSAGE,
    max_request_items=MAX_ITEMS,
)
# No periodic no-op records: the log moves only when someone writes.
QUIET = ControllerSettings(
    broker_session_timeout_ms=3_000,
    broker_heartbeat_interval_ms=500,
    tick_interval_ms=50,
    metadata_max_idle_interval_ms=0,
)

# A servicer that raised, or a status nothing in kq sends.
CRASHES = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.UNIMPLEMENTED,
}


# -- the methods, from the descriptors -------------------------------------------------------


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    input: Descriptor

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    def __repr__(self) -> str:
        return self.path


def _proto_modules() -> Iterator[Any]:
    for info in pkgutil.iter_modules(kqproto.__path__):
        if info.name.endswith("_pb2"):
            yield importlib.import_module(f"kqproto.{info.name}")


# Services that controller nodes do not serve: the brokers' data plane
# (tests/broker/test_service_fuzz.py fuzzes it on a broker's servicer),
# their group coordinators' (tests/broker/test_group_service_fuzz.py) and
# their transaction coordinators' (tests/broker/test_txn_service.py).
SERVED_ELSEWHERE = frozenset(
    {"kq.broker.BrokerService", "kq.groups.GroupService", "kq.txn.TransactionService"}
)


def _methods() -> list[Method]:
    out = []
    for module in _proto_modules():
        for service in module.DESCRIPTOR.services_by_name.values():
            if service.full_name in SERVED_ELSEWHERE:
                continue
            m: MethodDescriptor
            for m in service.methods:
                if not (m.client_streaming or m.server_streaming):
                    out.append(Method(service.full_name, m.name, m.input_type))
    return sorted(out, key=lambda m: m.path)


METHODS = _methods()
RAFT_METHODS = [m for m in METHODS if m.service == "kq.raft.RaftService"]
SERVICES = sorted({m.service for m in METHODS})


# -- requests from the descriptors -----------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
# Values that route a request past the first checks (the cluster, the
# addressee, a sender the caller's certificate names), or sit at a limit.
_HINTS: dict[str, list[Any]] = {
    "cluster_id": [CLUSTER_ID],
    "src": [1, 2, 3, BROKER_ID, OUTSIDER],
    "dst": [1, 2, 3],
    "leader_id": [1, 2, 3, OUTSIDER, -1],
    "broker_id": [BROKER_ID, 0, 1],
    "epoch": [0, 1, 2, 3, 1000, MAX_EPOCH, MAX_EPOCH + 1],
    "last_epoch": [0, 1, MAX_EPOCH, MAX_EPOCH + 1],
    "last_fetched_epoch": [0, 1, MAX_EPOCH + 1],
    "name": ["t", "kafka-cluster", "metadata.version", "*", "a" * 250],
    "principal": ["User:fuzzer", "User:*", f"User:{ADMIN}"],
}


def _edges(lo: int, hi: int) -> list[int]:
    near = [0, 1, -1, 2, 2**31 - 2, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1]
    return sorted({v for v in [lo, hi, *near] if lo <= v <= hi})


def _scalar(f: FieldDescriptor, large: bool = False) -> st.SearchStrategy[Any]:
    """Values of a scalar field; strings and bytes past the message size
    limit only where ``large`` (a request's own singular fields, so that a
    request holds at most one)."""
    t = f.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        base: st.SearchStrategy[Any] = st.one_of(
            st.sampled_from(_edges(lo, hi)),
            st.integers(max(lo, -1000), min(hi, 1000)),
            st.integers(lo, hi),
        )
    elif t == FieldDescriptor.TYPE_BOOL:
        base = st.booleans()
    elif t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        base = st.floats(width=32) if t == FieldDescriptor.TYPE_FLOAT else st.floats()
    elif t == FieldDescriptor.TYPE_STRING:
        base = st.text(max_size=20)
        if large:
            base = st.one_of(base, st.integers(0, MAX_MESSAGE + 4096).map(lambda n: "x" * n))
    elif t == FieldDescriptor.TYPE_BYTES:
        base = st.binary(max_size=40)
        if large:
            base = st.one_of(base, st.integers(0, MAX_MESSAGE + 4096).map(lambda n: b"\xff" * n))
    elif t == FieldDescriptor.TYPE_ENUM:
        assert f.enum_type is not None
        known = [v.number for v in f.enum_type.values]
        base = st.one_of(st.sampled_from(known), st.sampled_from([-1, 99, 2**31 - 1]))
    else:  # pragma: no cover - a new scalar type: fuzz it by hand
        raise AssertionError(f"no strategy for {f.full_name} (type {t})")
    hints = _HINTS.get(f.name)
    if hints is not None:
        hinted = [h for h in hints if isinstance(h, str) == (t == FieldDescriptor.TYPE_STRING)]
        if hinted:
            return st.one_of(st.sampled_from(hinted), base)
    return base


_MAX_DEPTH = 3
_MESSAGES: dict[tuple[str, int], st.SearchStrategy[Message]] = {}


def _value(f: FieldDescriptor, depth: int, large: bool = False) -> st.SearchStrategy[Any] | None:
    if f.type != FieldDescriptor.TYPE_MESSAGE:
        return _scalar(f, large)
    if depth >= _MAX_DEPTH or f.message_type is None:
        return None
    return message_of(f.message_type, depth + 1)


def _field(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    entry = f.message_type
    if f.is_repeated and entry is not None and entry.GetOptions().map_entry:
        key = _scalar(entry.fields_by_name["key"])
        value = _value(entry.fields_by_name["value"], depth)
        if value is None:
            return None
        return st.dictionaries(key, value, max_size=4)
    one = _value(f, depth, large=depth == 0 and not f.is_repeated)
    if one is None:
        return None
    if not f.is_repeated:
        return one
    if depth > 0:
        return st.lists(one, max_size=4)
    # In the request itself: a few items, or many copies of one (past the
    # items limit); a few megabytes at most.
    return st.one_of(
        st.lists(one, max_size=4),
        st.tuples(one, st.integers(0, MAX_ITEMS + 200)).map(lambda t: [t[0]] * t[1]),
    )


def message_of(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type ``desc`` with any subset of their fields set."""
    key = (desc.full_name, depth)
    found = _MESSAGES.get(key)
    if found is not None:
        return found
    cls = GetMessageClass(desc)
    optional = {}
    for f in desc.fields:
        strategy = _field(f, depth)
        if strategy is not None:
            optional[f.name] = strategy
    made = st.fixed_dictionaries({}, optional=optional).map(lambda kw: cls(**kw))
    _MESSAGES[key] = made
    return made


@st.composite
def routed(draw: st.DrawFn, method: Method, node: int) -> Message:
    """A message that gets past the first checks: of this cluster, addressed
    to ``node``, from a sender some certificate names, a BeginQuorumEpoch or
    EndQuorumEpoch naming its sender as leader; the rest as it comes."""
    msg: Any = draw(message_of(method.input))
    fields = method.input.fields_by_name
    if "cluster_id" in fields:
        msg.cluster_id = CLUSTER_ID
    if "dst" in fields:
        msg.dst = node
    if "src" in fields:
        msg.src = draw(st.sampled_from(_HINTS["src"]))
        if "leader_id" in fields:
            msg.leader_id = msg.src
    if "epoch" in fields:
        # Past any epoch the cluster reaches by itself, up to the limit.
        msg.epoch = draw(st.one_of(st.sampled_from(_HINTS["epoch"]), st.integers(0, MAX_EPOCH + 1)))
    made: Message = msg
    return made


def payload_of(method: Method, node: int) -> st.SearchStrategy[bytes]:
    """A request's bytes: a message of the method's type (routed or not), or
    any bytes."""
    return st.one_of(
        routed(method, node).map(lambda m: m.SerializeToString()),
        message_of(method.input).map(lambda m: m.SerializeToString()),
        st.binary(max_size=512),
    )


class Request:
    """One request of a batch: its node, method and bytes."""

    __slots__ = ("data", "method", "node")

    def __init__(self, node: int, method: Method, data: bytes) -> None:
        self.node = node
        self.method = method
        self.data = data

    def __repr__(self) -> str:
        # Short, so that a failing example prints (and a passing one costs
        # nothing to describe): the bytes' start and their length.
        head = self.data[:96]
        more = f"... ({len(self.data)} bytes)" if len(self.data) > len(head) else ""
        return f"Request(node={self.node}, {self.method}, {head!r}{more})"


@st.composite
def batches(draw: st.DrawFn) -> list[Request]:
    """1 to 4 requests: (node, method, bytes)."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        # The quorum's own RPCs a third of the time (they are the ones
        # that move epochs and leaders), any method otherwise.
        method = draw(st.one_of(st.sampled_from(METHODS), st.sampled_from(RAFT_METHODS)))
        node = draw(st.sampled_from([1, 2, 3]))
        out.append(Request(node, method, draw(payload_of(method, node))))
    return out


# -- the cluster, in a loop of its own -----------------------------------------------------

T = TypeVar("T")


class LoopThread:
    """An event loop running in a thread, so the nodes' timers keep running
    while Hypothesis makes the next example."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T], timeout_s: float = 60.0) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


CALLERS: dict[str, Identity | None] = {
    "plaintext": None,
    "user": Identity.user(CLUSTER_ID, "fuzzer"),
    "controller-9": Identity.node(CLUSTER_ID, IdentityRole.CONTROLLER, OUTSIDER),
    "broker-7": Identity.node(CLUSTER_ID, IdentityRole.BROKER, BROKER_ID),
    "admin": Identity.user(CLUSTER_ID, ADMIN),
}


class Errors(logging.Handler):
    """Every record at ERROR or above, from any logger."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Env:
    cluster: TlsMetadataCluster
    loop: LoopThread
    errors: Errors
    credentials: dict[str, grpc.ChannelCredentials | None] = field(default_factory=dict)
    channels: dict[tuple[str, int], grpc.aio.Channel] = field(default_factory=dict)
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    largest: int = 0

    def channel(self, caller: str, node: int) -> grpc.aio.Channel:
        found = self.channels.get((caller, node))
        if found is None:
            found = self.channels[(caller, node)] = dial(
                self.cluster.voters[node], self.credentials[caller], max_message_bytes=8 << 20
            )
        return found

    async def call(self, caller: str, node: int, method: Method, data: bytes) -> grpc.StatusCode:
        call = self.channel(caller, node).unary_unary(
            method.path, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            await call(data, timeout=RPC_S)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            assert code not in CRASHES, f"{method} from {caller}: {code.name}: {exc.details()}"
            return code
        return grpc.StatusCode.OK

    # -- what the nodes store ----------------------------------------------------------

    async def quorum_view(self) -> dict[int, tuple[Any, ...]]:
        out = {}
        for n, s in sorted(self.cluster.servers.items()):
            core = s.node.core
            out[n] = (core.epoch, core.leader_id, core.voted_for, s.storage.state.read())
        return out

    async def full_view(self) -> dict[int, tuple[Any, ...]]:
        quorum = await self.quorum_view()
        out = {}
        for n, s in sorted(self.cluster.servers.items()):
            status = s.node.status()
            out[n] = (
                *quorum[n],
                status.log_end_offset,
                s.state_machine.applied_offset,
                s.state_machine.digest(),
                plugin_of(s).controller.committed_image(),
            )
        return out

    async def broker_view(self) -> dict[int, tuple[Any, ...]]:
        quorum = await self.quorum_view()
        out = {}
        for n, s in sorted(self.cluster.servers.items()):
            image = plugin_of(s).controller.committed_image()
            out[n] = (*quorum[n], image.topics, image.configs, image.features, image.acls)
        return out

    # -- alive, led, committing ----------------------------------------------------------

    async def check_serving(self, round_: int) -> None:
        for n, s in self.cluster.servers.items():
            assert s.node.failure is None, (n, s.node.failure)
        for n in self.cluster.voters:
            stub = quorum_pb2_grpc.QuorumServiceStub(self.channel("admin", n))
            await stub.DescribeQuorum(quorum_pb2.DescribeQuorumRequest(), timeout=RPC_S)
        addresses = list(self.cluster.voters.values())
        async with KvClient(addresses, credentials=self.credentials["admin"]) as client:
            await client.put(f"alive-{round_}", b"1")
        leader = await self.cluster.wait_leader()
        await self.cluster.wait_for(
            lambda: all(
                s.state_machine.applied_offset >= leader.state_machine.applied_offset
                for s in self.cluster.servers.values()
            )
        )

    def take_errors(self) -> list[str]:
        out = [f"{r.name}: {r.getMessage()}" for r in self.errors.records]
        self.errors.records.clear()
        return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    loop = LoopThread()
    cluster = TlsMetadataCluster(tmp_path_factory.mktemp("fuzz"), OPTIONS, QUIET)
    errors = Errors()
    logging.getLogger().addHandler(errors)
    e = Env(cluster, loop, errors)
    try:
        for name, identity in CALLERS.items():
            e.credentials[name] = (
                None if identity is None else cluster.tls_files(identity).channel_credentials()
            )

        async def start() -> None:
            for n in cluster.voters:
                await cluster.start(n)
            await cluster.wait_leader()
            await e.check_serving(0)

        loop.run(start())
        yield e
    finally:
        logging.getLogger().removeHandler(errors)

        async def stop() -> None:
            for channel in e.channels.values():
                await channel.close()
            for n in list(cluster.servers):
                await cluster.stop(n, resign=False)

        try:
            loop.run(stop())
        finally:
            loop.close()


def test_every_service_the_node_serves_is_fuzzed(env: Env) -> None:
    server = env.cluster.servers[1]
    served = {
        "kq.raft.RaftService",
        "kq.quorum.QuorumService",
        *(name for plugin in server.plugins for name in plugin.service_names),
    }
    assert served == set(SERVICES)
    assert len(METHODS) >= 30, METHODS


# -- the fuzzing -----------------------------------------------------------------------------

View = Callable[[Env], Awaitable[dict[int, tuple[Any, ...]]]]
# Which part of the stored state a caller must leave unchanged (None: it may
# change anything, as long as the cluster keeps serving).
MUST_KEEP: dict[str, View | None] = {
    "plaintext": Env.full_view,
    "user": Env.full_view,
    "controller-9": Env.full_view,
    "broker-7": Env.broker_view,
    "admin": None,
}
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    # Shrinking replays examples against a cluster whose state moved on.
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
    ],
    print_blob=True,
)


@dataclass
class Budget:
    started: float = field(default_factory=time.monotonic)

    def spent(self) -> bool:
        return time.monotonic() - self.started > BUDGET_S


_BUDGETS: dict[str, Budget] = {}
_ROUNDS = [0]


def _fuzz_one(env: Env, caller: str, batch: list[Request]) -> None:
    budget = _BUDGETS.setdefault(caller, Budget())
    if budget.spent():
        return
    keep = MUST_KEEP[caller]

    async def go() -> None:
        before = await keep(env) if keep is not None else None
        for request in batch:
            method = request.method
            env.largest = max(env.largest, len(request.data))
            code = await env.call(caller, request.node, method, request.data)
            if caller == "plaintext":
                assert code == grpc.StatusCode.UNAVAILABLE, (method, code)
            env.statuses.setdefault(caller, {})
            env.statuses[caller][code.name] = env.statuses[caller].get(code.name, 0) + 1
        if keep is not None:
            await asyncio.sleep(0.05)
            after = await keep(env)
            assert after == before, f"{caller} changed the stored state with {batch!r}"
        _ROUNDS[0] += 1
        await env.check_serving(_ROUNDS[0])

    env.loop.run(go())
    errors = env.take_errors()
    assert not errors, errors


@pytest.mark.slow
@pytest.mark.parametrize("caller", list(CALLERS))
def test_fuzzed_requests_never_crash_a_node_nor_change_what_they_may_not(
    env: Env, caller: str
) -> None:
    print(f"replay with KQ_FUZZ_SEED={SEED}")

    @FUZZ
    @seed(SEED + list(CALLERS).index(caller))
    @given(batch=batches())
    def fuzz(batch: list[Request]) -> None:
        _fuzz_one(env, caller, batch)

    fuzz()
    seen = env.statuses.get(caller, {})
    assert sum(seen.values()) > 0, "no request was sent"
    print(f"{caller}: statuses {seen}; largest request so far {env.largest} bytes")

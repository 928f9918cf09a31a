"""The brokers under faults, as real processes: one local cluster of 3
controllers and 3 brokers (started through ``server.local_cluster`` and
``server.local_brokers``, as ``kq cluster up --brokers 3``), mutual TLS,
and per test a fresh topic with replication factor 3 and
``min.insync.replicas=2``.

Each test produces acks=all with the idempotent producer (a steady stream
of unique values) while a fault hits a broker: the partition leader
killed with SIGKILL and restarted, paused (SIGSTOP) past the broker
session timeout and resumed, a follower cut off from the leader with
iptables (``chaos.netfilter``: each broker marks its packets with its own
DSCP value), a broker stopped with SIGTERM (controlled shutdown).  After
each, every acknowledged record is read back at its acknowledged offset
and no value is in the log twice.  Last, a Produce answer dropped on
purpose at the client, with the leader killed before the retry: with
idempotence the new leader answers the retry with the first write's
offset (Kafka's duplicate batch, ``ProducerStateEntry``'s five-batch
window), without it the retry writes the value again and the duplicate
check fires.

Every wait is bounded and every process is stopped by its pid, whatever
happens; the iptables rules are removed at the end even on failure.  One
run of this module per host at a time: its brokers' loopback addresses
(127.0.1.4-6) and DSCP values are the same for every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from broker.client.consumer import ConsumerConfig, OffsetResetStrategy
from broker.client.producer_batch import Acks, ProducerConfig
from broker.errors import Errors as BrokerErrors
from broker.grpc_client import Consumer, Producer, RecordMetadata
from chaos.netfilter import Netfilter, NetfilterError
from kqproto import broker_pb2, metadata_pb2
from metadata.client import ConfigOp, ConfigResource, MetadataClient, NewTopic, TopicPartition
from server.local_brokers import start_brokers, stop_members
from server.local_cluster import (
    BrokerState,
    ClusterState,
    broker_addresses,
    broker_host,
    check_configs,
    check_ports,
    format_new_nodes,
    free_base_port,
    local_cluster_state,
    make_certs,
    process_alive,
    run_kq,
    spawn_node,
    wait_for_leader,
    write_broker_configs,
    write_configs,
)

pytestmark = pytest.mark.slow

# The controller fences a broker silent for this long (Kafka's
# broker.session.timeout.ms, 9 s by default; shorter here so that a paused
# or killed leader loses its partitions within the test's bounds).
SESSION_MS = 4_000
# replica.lag.time.max.ms, set for the cluster: an isolated follower
# leaves the ISR this long after it stopped catching up.
LAG_MS = 2_000
# Broker b marks its packets with DSCP value DSCP_BASE + b; the chaos
# harness's local clusters use 10 + node, so both can share a host.
DSCP_BASE = 40
# The longest any one wait of these tests lasts (the machine is small and
# shared: generous, but bounded).
WAIT_S = 60.0


def dscp(broker_id: int) -> int:
    return DSCP_BASE + broker_id


@dataclass
class Faults:
    """The running cluster and what the tests do to it."""

    state: ClusterState
    procs: dict[int, subprocess.Popen[bytes]]
    netfilter: Netfilter | None
    # Why there is no netfilter (iptables missing or not permitted).
    no_netfilter: str = ""
    # Every pid started, with the config file its command line names.
    pids: dict[int, str] = field(default_factory=dict)

    def track(self) -> None:
        for n in self.state.members:
            if n.pid is not None:
                self.pids[n.pid] = str(self.state.path(n.config))

    @property
    def bootstrap(self) -> list[str]:
        return broker_addresses(self.state.dir)

    @property
    def credentials(self) -> grpc.ChannelCredentials | None:
        return self.state.client_credentials()

    def broker(self, broker_id: int) -> BrokerState:
        return self.state.broker(broker_id)

    @contextlib.asynccontextmanager
    async def controller(self) -> AsyncIterator[MetadataClient]:
        client = MetadataClient(
            [n.address for n in self.state.nodes], timeout_s=10.0, credentials=self.credentials
        )
        try:
            yield client
        finally:
            await client.close()

    async def create_topic(self, name: str, partitions: int = 1) -> None:
        async with self.controller() as admin:
            created = await admin.create_topics(
                [NewTopic(name, partitions, 3, configs={"min.insync.replicas": "2"})]
            )
        assert created.topics[0].error == 0, created
        # Every partition led and its ISR full before the fault.
        await self.wait_partitions(
            name, lambda ps: all(p.leader >= 0 and len(p.isr) == 3 for p in ps), "led, ISR full"
        )

    async def partitions(self, name: str) -> list[metadata_pb2.PartitionDescription]:
        async with self.controller() as admin:
            answer = await admin.describe_topics([name])
        return list(answer.topics[0].partitions)

    async def wait_partitions(
        self,
        name: str,
        check: Callable[[list[metadata_pb2.PartitionDescription]], bool],
        what: str,
        timeout_s: float = WAIT_S,
    ) -> list[metadata_pb2.PartitionDescription]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = await self.partitions(name)
            if check(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {name} not {what} within {timeout_s:g} s: {found}")
            await asyncio.sleep(0.2)

    # -- process faults (by pid) --------------------------------------------------

    def kill(self, broker_id: int) -> None:
        proc = self.procs.pop(broker_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        self.broker(broker_id).pid = None
        self.state.save()

    def signal(self, broker_id: int, sig: signal.Signals) -> None:
        os.kill(self.procs[broker_id].pid, sig)

    async def start(self, broker_id: int) -> None:
        """Start a stopped broker again over its directories: it keeps
        every replica it had (none is taken for a stray and set aside to be
        fetched again from offset 0)."""
        broker = self.broker(broker_id)
        started = await start_brokers(self.state, [broker], WAIT_S)
        self.procs.update(started)
        self.track()
        strays = [
            p.name
            for d in broker.log_dirs
            for p in self.state.path(d).iterdir()
            if p.name.endswith("-stray")
        ]
        assert not strays, f"broker {broker_id} took its replicas for strays: {strays}"


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    directory = tmp_path_factory.mktemp("faults") / "cluster"
    directory.mkdir()
    state = local_cluster_state(directory, free_base_port(3, brokers=3), 3, 3)
    state.tls = True
    netfilter: Netfilter | None = Netfilter(f"KQ-FAULTS-{secrets.token_hex(3)}")
    no_netfilter = ""
    fx = Faults(state, {}, None)
    try:
        assert netfilter is not None
        try:
            # Before any broker connects: NAT is decided on a connection's
            # first packet (chaos.netfilter).
            netfilter.install({dscp(b.node_id): broker_host(b.node_id) for b in state.brokers})
        except NetfilterError as error:
            no_netfilter = str(error)
            netfilter.remove()
            netfilter = None
        fx.netfilter, fx.no_netfilter = netfilter, no_netfilter
        make_certs(state)
        write_configs(
            state,
            {
                "controller.broker_session_timeout_ms": SESSION_MS,
                "controller.broker_heartbeat_interval_ms": 500,
            },
        )
        write_broker_configs(
            state,
            {"broker.heartbeat_interval_ms": 500},
            per_broker=(lambda b: {"node.dscp": dscp(b)}) if netfilter is not None else None,
        )
        state.save()
        check_configs(state)
        check_ports(state, state.members)
        format_new_nodes(state)
        controllers = {n.node_id: spawn_node(state, n) for n in state.nodes}
        fx.procs.update(controllers)
        fx.track()
        asyncio.run(wait_for_leader(state, controllers, WAIT_S))
        fx.procs.update(asyncio.run(start_brokers(state, state.brokers, WAIT_S)))
        fx.track()

        async def lag() -> None:
            async with fx.controller() as admin:
                answer = await admin.alter_configs(
                    {ConfigResource.cluster(): [ConfigOp("replica.lag.time.max.ms", str(LAG_MS))]}
                )
            assert all(r.error == 0 for r in answer.results), answer

        asyncio.run(lag())
        yield fx
    finally:
        fx.track()
        try:
            for proc in fx.procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            stop_members(state, state.members, 10.0)
        finally:
            for pid, marker in fx.pids.items():
                if process_alive(pid, marker):
                    os.kill(pid, signal.SIGKILL)
            for proc in fx.procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            if netfilter is not None:
                netfilter.remove()
                assert netfilter.leftovers() == []


# -- the workload and its checks ----------------------------------------------------


@dataclass
class Stream:
    """Unique values produced acks=all to one partition, and what became of
    each: the acknowledged ones with their metadata, the failed ones with
    their error."""

    topic: str
    partition: int = 0
    acked: dict[bytes, RecordMetadata] = field(default_factory=dict)
    failed: dict[bytes, BaseException] = field(default_factory=dict)
    sent: int = 0


async def produce_through(
    fx: Faults,
    stream: Stream,
    fault: Callable[[], Awaitable[None]],
    *,
    every_s: float = 0.01,
    config: ProducerConfig | None = None,
    partitions: int = 1,
) -> None:
    """Send a value every ``every_s`` (round robin over ``partitions``)
    while ``fault`` runs, and for a second before and after; then wait for
    every answer (bounded by the delivery timeout)."""
    config = config or ProducerConfig(linger_ms=0, delivery_timeout_ms=90_000)
    done = asyncio.Event()
    futures: dict[bytes, asyncio.Future[RecordMetadata]] = {}
    async with Producer(fx.bootstrap, config, credentials=fx.credentials) as producer:

        async def send() -> None:
            stop_at: float | None = None
            while stop_at is None or time.monotonic() < stop_at:
                if stop_at is None and done.is_set():
                    stop_at = time.monotonic() + 1.0
                value = f"{stream.topic}-{stream.sent:06d}".encode()
                part = stream.sent % partitions
                futures[value] = await producer.send(stream.topic, value, partition=part)
                stream.sent += 1
                await asyncio.sleep(every_s)

        async def run_fault() -> None:
            try:
                await asyncio.sleep(1.0)
                await fault()
            finally:
                done.set()

        await asyncio.wait_for(asyncio.gather(send(), run_fault()), 5 * WAIT_S)
        await asyncio.wait_for(
            asyncio.gather(*futures.values(), return_exceptions=True),
            config.delivery_timeout_ms / 1000 + 10,
        )
    for value, future in futures.items():
        error = future.exception()
        if error is None:
            stream.acked[value] = future.result()
        else:
            stream.failed[value] = error


async def read_log(fx: Faults, topic: str, partition: int, end: int) -> dict[int, bytes | None]:
    """Every record of the partition below offset ``end``, by offset,
    through the consumer (from the leader, below its HW)."""
    config = ConsumerConfig(auto_offset_reset=OffsetResetStrategy.EARLIEST, fetch_max_wait_ms=200)
    found: dict[int, bytes | None] = {}
    async with Consumer(fx.bootstrap, config, credentials=fx.credentials) as consumer:
        consumer.assign([(topic, partition)])
        consumer.seek((topic, partition), 0)
        deadline = time.monotonic() + WAIT_S
        while len(found) < end and (not found or max(found) < end - 1):
            assert time.monotonic() < deadline, f"read {len(found)} of {end} records in time"
            for record in await consumer.poll(500):
                found[record.offset] = record.value
    return found


def duplicates(log: dict[int, bytes | None]) -> dict[bytes | None, list[int]]:
    """Values at more than one offset, with their offsets."""
    where: dict[bytes | None, list[int]] = {}
    for offset, value in sorted(log.items()):
        where.setdefault(value, []).append(offset)
    return {v: o for v, o in where.items() if len(o) > 1}


async def check_stream(fx: Faults, stream: Stream, partitions: int = 1) -> None:
    """Every acknowledged record at its acknowledged offset, nothing twice."""
    assert stream.acked, "nothing was acknowledged"
    for part in range(partitions):
        acked = {v: m for v, m in stream.acked.items() if m.partition == part}
        if not acked:
            continue
        end = max(m.offset for m in acked.values()) + 1
        log = await read_log(fx, stream.topic, part, end)
        misplaced = {
            v: (m.offset, log.get(m.offset)) for v, m in acked.items() if log.get(m.offset) != v
        }
        assert not misplaced, f"acknowledged records not at their offsets: {misplaced}"
        assert not duplicates(log), f"values written twice: {duplicates(log)}"


def leader_of(parts: Sequence[metadata_pb2.PartitionDescription], partition: int = 0) -> int:
    return parts[partition].leader


# -- the tests ------------------------------------------------------------------------


def test_leader_killed_and_restarted_loses_no_acknowledged_record(faults: Faults) -> None:
    topic = "sigkill"

    async def body() -> None:
        await faults.create_topic(topic)
        leader = leader_of(await faults.partitions(topic))
        stream = Stream(topic)

        async def fault() -> None:
            await asyncio.to_thread(faults.kill, leader)
            # A new leader once the controller fences the dead one.
            await faults.wait_partitions(topic, lambda ps: ps[0].leader not in (-1, leader), "led")
            await asyncio.sleep(1.0)
            await faults.start(leader)
            # It comes back as a follower and the leader adds it to the ISR.
            await faults.wait_partitions(topic, lambda ps: leader in ps[0].isr, "with it in ISR")

        await produce_through(faults, stream, fault)
        assert not stream.failed, f"records failed: {stream.failed}"
        await check_stream(faults, stream)

    asyncio.run(body())


def test_leader_paused_past_its_session_rejoins_as_follower(faults: Faults) -> None:
    """SIGSTOP past the session timeout: the controller fences the leader
    and elects another; resumed, it takes the new epoch as a follower
    (truncating what it appended alone), rejoins the ISR, and, made leader
    again by a preferred election, serves exactly the acknowledged log."""
    topic = "sigstop"

    async def body() -> None:
        await faults.create_topic(topic)
        first = await faults.partitions(topic)
        leader = leader_of(first)
        stream = Stream(topic)

        async def fault() -> None:
            faults.signal(leader, signal.SIGSTOP)
            try:
                await faults.wait_partitions(
                    topic, lambda ps: ps[0].leader not in (-1, leader), "led elsewhere"
                )
                await asyncio.sleep(1.0)
            finally:
                faults.signal(leader, signal.SIGCONT)
            back = await faults.wait_partitions(
                topic, lambda ps: leader in ps[0].isr, "with it in ISR"
            )
            assert back[0].leader != leader, back  # a follower now

        # A request stuck at the paused leader is retried after 5 s (plus
        # the client's margin), not after Kafka's default 30 s.
        config = ProducerConfig(linger_ms=0, request_timeout_ms=5_000, delivery_timeout_ms=90_000)
        await produce_through(faults, stream, fault, config=config)
        assert not stream.failed, f"records failed: {stream.failed}"
        await check_stream(faults, stream)
        # Read it from the resumed broker itself: the preferred replica
        # leads again after a preferred election (it was the first leader).
        assert first[0].replicas[0] == leader
        async with faults.controller() as admin:
            await admin.elect_leaders(metadata_pb2.PREFERRED, [TopicPartition(topic, 0)])
        await faults.wait_partitions(topic, lambda ps: ps[0].leader == leader, "led by it again")
        await check_stream(faults, stream)

    asyncio.run(body())


def test_isolated_follower_leaves_the_isr_and_comes_back(faults: Faults) -> None:
    """iptables drops the follower's packets to the leader and the
    leader's to the follower (by their DSCP marks): after
    replica.lag.time.max.ms the leader shrinks the ISR, acks=all goes on
    with two; healed, the follower catches up and is added back."""
    if faults.netfilter is None:
        pytest.skip(f"no network faults on this host: {faults.no_netfilter}")
    netfilter = faults.netfilter
    topic = "isolated"

    async def body() -> None:
        await faults.create_topic(topic)
        parts = await faults.partitions(topic)
        leader = leader_of(parts)
        follower = next(b for b in parts[0].isr if b != leader)
        stream = Stream(topic)
        described: list[str] = []

        async def fault() -> None:
            await asyncio.to_thread(
                netfilter.block,
                [(dscp(follower), broker_host(leader)), (dscp(leader), broker_host(follower))],
            )
            try:
                shrunk = await faults.wait_partitions(
                    topic, lambda ps: follower not in ps[0].isr, "without the follower in ISR"
                )
                assert shrunk[0].leader == leader and len(shrunk[0].isr) == 2, shrunk
                # What an operator sees meanwhile.
                done = await asyncio.to_thread(
                    run_kq, "topics", "describe", topic, "--cluster-dir", str(faults.state.dir)
                )
                assert done.returncode == 0, done.stderr
                described.append(done.stdout)
                await asyncio.sleep(2.0)  # acks=all goes on with ISR 2
            finally:
                await asyncio.to_thread(netfilter.heal)
            await faults.wait_partitions(
                topic, lambda ps: follower in ps[0].isr, "with the follower back in ISR"
            )

        await produce_through(faults, stream, fault)
        assert not stream.failed, f"records failed: {stream.failed}"
        isr = ",".join(str(b) for b in sorted(set(parts[0].isr) - {follower}))
        assert f"Isr: {isr}" in described[0], described[0]
        await check_stream(faults, stream)

    asyncio.run(body())


def test_controlled_shutdown_moves_leadership_before_the_broker_exits(faults: Faults) -> None:
    """SIGTERM to a broker that leads a partition: while it still runs, the
    metadata shows it leading nothing; it exits 0 before the controller
    would have fenced it, and no record produced meanwhile fails."""
    topic = "sigterm"

    async def body() -> None:
        await faults.create_topic(topic, partitions=3)
        parts = await faults.partitions(topic)
        broker = leader_of(parts)
        stream = Stream(topic)
        seen: list[tuple[bool, list[int], bool]] = []
        exited: list[float] = []

        async def fault() -> None:
            proc = faults.procs[broker]
            faults.signal(broker, signal.SIGTERM)
            deadline = time.monotonic() + WAIT_S
            async with faults.controller() as admin:
                while proc.poll() is None:
                    assert time.monotonic() < deadline, f"broker {broker} did not exit"
                    before = proc.poll() is None
                    answer = await admin.describe_topics([topic], linearizable=False)
                    leaders = [p.leader for p in answer.topics[0].partitions]
                    seen.append((before, leaders, proc.poll() is None))
                    await asyncio.sleep(0.05)
                exited.append(time.monotonic())
                # Right after the exit, well within the session timeout (so
                # not by fencing): it leads nothing.
                after = await admin.describe_topics([topic])
            assert time.monotonic() - exited[0] < SESSION_MS / 1000, "describe too slow"
            assert broker not in [p.leader for p in after.topics[0].partitions], after
            assert proc.returncode == 0
            faults.procs.pop(broker)
            faults.broker(broker).pid = None
            faults.state.save()
            await asyncio.sleep(1.0)
            await faults.start(broker)

        await produce_through(faults, stream, fault, partitions=3)
        # Observed alive (before and after the read) while leading nothing.
        assert any(a and b and broker not in leaders for a, leaders, b in seen), seen
        log = faults.state.path(faults.broker(broker).log_file).read_text()
        assert "controlled shutdown did not finish" not in log
        assert not stream.failed, f"records failed: {stream.failed}"
        await check_stream(faults, stream, partitions=3)

    asyncio.run(body())


class DropOneAnswer:
    """Wraps a producer's broker stubs: once armed, the next successful
    Produce answer is dropped (the request went through, the client sees a
    broken connection, as when a broker dies between its write and its
    answer) and ``on_drop`` runs; what the dropped answer said is kept."""

    def __init__(self, producer: Producer, on_drop: Callable[[], Awaitable[None]]) -> None:
        self.armed = False
        self.dropped: broker_pb2.ProducePartitionResponse | None = None
        self._on_drop = on_drop
        real = producer.metadata.stub

        def stub(node: int) -> Any:
            return _Stub(self, real(node))

        producer.metadata.stub = stub  # type: ignore[method-assign]


class _Stub:
    def __init__(self, drop: DropOneAnswer, stub: Any) -> None:
        self._drop = drop
        self._stub = stub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def Produce(self, request: Any, **kwargs: Any) -> Any:
        answer = await self._stub.Produce(request, **kwargs)
        parts = [p for t in answer.topics for p in t.partitions]
        if self._drop.armed and parts and all(p.error == BrokerErrors.NONE for p in parts):
            self._drop.armed = False
            self._drop.dropped = parts[0]
            await self._drop._on_drop()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "answer dropped by the test",
            )
        return answer


async def retry_through_a_kill(
    fx: Faults, topic: str, config: ProducerConfig
) -> tuple[dict[bytes, RecordMetadata], int, dict[int, bytes | None]]:
    """Produce 20 values one at a time; the answer to the 10th is dropped
    and its leader killed before the client retries (to the next leader).
    The acknowledged metadata, the offset the dropped answer named, and the
    log."""
    await fx.create_topic(topic)
    leader = leader_of(await fx.partitions(topic))

    async def kill() -> None:
        await asyncio.to_thread(fx.kill, leader)

    acked: dict[bytes, RecordMetadata] = {}
    try:
        async with Producer(fx.bootstrap, config, credentials=fx.credentials) as producer:
            drop = DropOneAnswer(producer, kill)
            for i in range(20):
                value = f"{topic}-{i:03d}".encode()
                drop.armed = i == 10
                future = await producer.send(topic, value, partition=0)
                acked[value] = await asyncio.wait_for(future, config.delivery_timeout_ms / 1000)
            assert drop.dropped is not None, "no answer was dropped"
            dropped_at = drop.dropped.base_offset
    finally:
        if leader not in fx.procs:
            await fx.start(leader)
    end = max(m.offset for m in acked.values()) + 1
    return acked, dropped_at, await read_log(fx, topic, 0, end)


def test_idempotent_retry_through_a_leader_kill_writes_once(faults: Faults) -> None:
    """The retry reaches a new leader, which has the producer's state from
    replication and answers with the first write's offset: the value is in
    the log once, where the client was told."""

    async def body() -> None:
        config = ProducerConfig(linger_ms=0, request_timeout_ms=5_000, delivery_timeout_ms=90_000)
        acked, dropped_at, log = await retry_through_a_kill(faults, "retry-idempotent", config)
        value = b"retry-idempotent-010"
        assert acked[value].offset == dropped_at
        assert log[dropped_at] == value
        assert not duplicates(log), duplicates(log)
        assert all(log[m.offset] == v for v, m in acked.items())
        assert len(log) == 20

    asyncio.run(body())


def test_without_idempotence_the_same_retry_writes_twice(faults: Faults) -> None:
    """The same run without idempotence: the retry is a new write, and the
    duplicate check of the other tests fires."""

    async def body() -> None:
        config = ProducerConfig(
            acks=Acks.ALL,
            enable_idempotence=False,
            max_in_flight_requests_per_connection=1,
            linger_ms=0,
            request_timeout_ms=5_000,
            delivery_timeout_ms=90_000,
        )
        acked, dropped_at, log = await retry_through_a_kill(faults, "retry-plain", config)
        value = b"retry-plain-010"
        assert log[dropped_at] == value
        assert acked[value].offset > dropped_at
        assert duplicates(log) == {value: [dropped_at, acked[value].offset]}

    asyncio.run(body())

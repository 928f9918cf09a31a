"""A consumer group through the failure of a member and of its coordinator,
as real processes: a local cluster of 3 controllers and 3 brokers (mutual
TLS, a short group session), a topic of 6 partitions with replication
factor 3, and three members, each a ``kq consume --group`` process that
prints every record and every commit the coordinator acknowledged
(``--json --print-commits``).

While a producer writes records with known values to every partition, one
member is killed with SIGKILL and then the group coordinator's broker
(found with FindCoordinator) is killed with SIGKILL and later started again.
All the while the group's committed offsets are read (OffsetFetch): none
may ever go backwards, nor be below a commit a member printed as
acknowledged before the read (through the failover too).  Every record
produced must be printed by some member.  Then the members stop (SIGTERM: they commit what they
printed and leave), more records are produced, and three new members start:
the first record each prints of each partition is at or after that
partition's last acknowledged commit, and every new record is printed.

Every wait is bounded, and every process the test started is stopped by its
pid whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import grpc
import pytest

from broker.client.producer_batch import ProducerConfig
from broker.errors import Errors
from broker.grpc_client import Producer, RecordMetadata
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.group_admin import GroupAdmin
from kqproto import groups_pb2, groups_pb2_grpc
from metadata.client import MetadataClient, NewTopic
from quorum.driver.tls import dial
from server.local_brokers import start_brokers, stop_members
from server.local_cluster import (
    ClusterState,
    check_configs,
    check_ports,
    format_new_nodes,
    free_base_port,
    local_cluster_state,
    make_certs,
    process_alive,
    spawn_node,
    wait_for_leader,
    write_broker_configs,
    write_configs,
)

pytestmark = pytest.mark.slow

TOPIC = "failover"
GROUP = "failover-group"
PARTITIONS = 6
# The group's session (group.session_timeout_ms): a killed member's
# partitions go to the others this long after its last heartbeat.
GROUP_SESSION_MS = 4_000
GROUP_HEARTBEAT_MS = 250
# The controller fences a silent broker after this long, and so elects
# new leaders for its partitions (the coordinator's among them).
BROKER_SESSION_MS = 4_000
# Records of the second phase, produced once the new members share the
# partitions.
SECOND = 60
# The producer's pace in the first phase, and the most it writes.
EVERY_S = 0.02
MOST = 3_000
# The longest any one wait lasts (a small, shared machine: generous, but
# bounded).
WAIT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


class Member:
    """One ``kq consume --group`` process and what it printed (read by a
    thread as it comes)."""

    def __init__(self, name: str, state: ClusterState, logs: Path) -> None:
        self.name = name
        self.stderr_path = logs / f"member-{name}.stderr"
        self.stdout_path = logs / f"member-{name}.stdout"
        self.records: list[dict[str, Any]] = []
        self.commits: list[dict[str, Any]] = []
        self.garbage: list[str] = []
        self.killed = False
        self._lock = threading.Lock()
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kq.cli", "consume", "--group", GROUP, "--topic", TOPIC,
                 "--from-beginning", "--json", "--print-commits", "--cluster-dir",
                 str(state.dir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                start_new_session=True,
            )  # fmt: skip
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[bytes]) -> None:
        with self.stdout_path.open("wb") as copy:
            for raw in stream:
                copy.write(raw)
                copy.flush()
                self._take(raw.decode("utf-8", "replace").rstrip("\n"))

    def _take(self, line: str) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            with self._lock:
                self.garbage.append(line)
            return
        with self._lock:
            if "committed" in obj:
                self.commits.append(obj["committed"])
            else:
                self.records.append(obj)

    def seen(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The records and the commits printed so far."""
        with self._lock:
            return list(self.records), list(self.commits)

    def summary(self) -> str:
        records, commits = self.seen()
        alive = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return (
            f"member {self.name} ({alive}, pid {self.proc.pid}): {len(records)} records, "
            f"{len(commits)} commits, the last {commits[-3:]}"
        )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        self.killed = True
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)

    def finish(self) -> None:
        """After the process ended: every line read."""
        self._reader.join(timeout=WAIT_S)
        assert not self._reader.is_alive(), f"member {self.name}: its output never ended"


def terminate(members: list[Member]) -> None:
    """SIGTERM each (it commits what it printed and leaves), by pid; each
    must exit 0 within WAIT_S."""
    for m in members:
        os.kill(m.proc.pid, signal.SIGTERM)
    for m in members:
        try:
            status = m.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"member {m.name} still runs {WAIT_S:g} s after SIGTERM") from None
        m.finish()
        assert status == 0, f"member {m.name} exited {status}:\n{m.stderr()}"


def stop_by_pid(members: list[Member]) -> None:
    for m in members:
        if m.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.proc.wait(timeout=10)
        if m.proc.stdout is not None:
            m.proc.stdout.close()


async def wait_until(
    check: Callable[[], Any], what: str | Callable[[], str], timeout_s: float = WAIT_S
) -> Any:
    """What ``check`` (a function or a coroutine function) returns, once it
    is true; an AssertionError naming ``what`` (or what it returns then)
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not within {timeout_s:g} s: {what if isinstance(what, str) else what()}"
            )
        await asyncio.sleep(0.2)


class Offsets:
    """The group's committed offsets, read again and again (OffsetFetch at
    the coordinator, wherever it is): any read below an earlier read, and
    any below a commit a member printed as acknowledged before the read was
    sent (the coordinator answers a commit once it is below the offsets
    partition's high watermark, so every later read has it, at any later
    coordinator too)."""

    def __init__(self, admin: GroupAdmin, members: list[Member]) -> None:
        self.admin = admin
        self.members = members
        self.highest: dict[int, int] = {}
        # (partition, offset read, the higher offset it fell behind): the
        # number of the read, each case once.
        self.backwards: dict[tuple[int, int, int], int] = {}
        self.behind_acknowledged: dict[tuple[int, int, int], int] = {}
        self.reads = 0

    async def read(self) -> dict[int, int] | None:
        floor = acknowledged_commits(self.members)
        try:
            found = await self.admin.list_group_offsets(GROUP)
        except BrokerClientError:
            return None  # no coordinator right now (a failover): read again later
        offsets = {tp.partition: c.offset for tp, c in found.items() if c is not None}
        self.reads += 1
        for p in sorted(offsets.keys() | self.highest.keys()):
            # A partition no longer answered (-1) went back too.
            offset = offsets.get(p, -1)
            if offset < self.highest.get(p, -1):
                self.backwards.setdefault((p, offset, self.highest[p]), self.reads)
            self.highest[p] = max(offset, self.highest.get(p, -1))
        for p, acked in floor.items():
            if offsets.get(p, -1) < acked:
                self.behind_acknowledged.setdefault((p, offsets.get(p, -1), acked), self.reads)
        return offsets

    def check(self) -> None:
        assert self.reads > 10, "the committed offsets were hardly ever read"
        assert not self.backwards, [
            f"partition {p}: committed {offset} (read {n}) after {before}"
            for (p, offset, before), n in self.backwards.items()
        ][:10]
        assert not self.behind_acknowledged, [
            f"partition {p}: committed {offset} (read {n}) after a commit of {acked} was "
            "acknowledged"
            for (p, offset, acked), n in self.behind_acknowledged.items()
        ][:10]

    async def run(self) -> None:
        while True:
            await self.read()
            await asyncio.sleep(0.1)


def printed(members: list[Member]) -> dict[tuple[int, int], set[str]]:
    """(partition, offset) -> the values printed there, by any of ``members``."""
    out: dict[tuple[int, int], set[str]] = {}
    for m in members:
        for r in m.seen()[0]:
            out.setdefault((r["partition"], r["offset"]), set()).add(r["value"])
    return out


def acknowledged_commits(members: list[Member]) -> dict[int, int]:
    """The highest commit each partition was acknowledged, by any member."""
    out: dict[int, int] = {}
    for m in members:
        for c in m.seen()[1]:
            assert c["topic"] == TOPIC, c
            out[c["partition"]] = max(out.get(c["partition"], -1), c["offset"])
    return out


def missing(produced: dict[tuple[int, int], str], members: list[Member]) -> list[str]:
    seen = printed(members)
    return [
        f"{p}:{o}={v}" for (p, o), v in sorted(produced.items()) if v not in seen.get((p, o), ())
    ]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ClusterState, dict[int, subprocess.Popen[bytes]]]]:
    directory = tmp_path / "cluster"
    directory.mkdir()
    state = local_cluster_state(directory, free_base_port(3, brokers=3), 3, 3)
    state.tls = True
    procs: dict[int, subprocess.Popen[bytes]] = {}
    pids: dict[int, str] = {}

    def track() -> None:
        for n in state.members:
            if n.pid is not None:
                pids[n.pid] = str(state.path(n.config))

    try:
        make_certs(state)
        write_configs(
            state,
            {
                "controller.broker_session_timeout_ms": BROKER_SESSION_MS,
                "controller.broker_heartbeat_interval_ms": 500,
            },
        )
        write_broker_configs(
            state,
            {
                "broker.heartbeat_interval_ms": 500,
                "group.session_timeout_ms": GROUP_SESSION_MS,
                "group.heartbeat_interval_ms": GROUP_HEARTBEAT_MS,
                "offsets.partitions": 3,
            },
        )
        state.save()
        check_configs(state)
        check_ports(state, state.members)
        format_new_nodes(state)
        controllers = {n.node_id: spawn_node(state, n) for n in state.nodes}
        procs.update(controllers)
        track()
        asyncio.run(wait_for_leader(state, controllers, WAIT_S))
        procs.update(asyncio.run(start_brokers(state, state.brokers, WAIT_S)))
        track()
        yield state, procs
    finally:
        track()
        try:
            stop_members(state, state.members, 10.0)
        finally:
            for pid, marker in pids.items():
                if process_alive(pid, marker):
                    os.kill(pid, signal.SIGKILL)
            for proc in procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)


def test_a_group_consumes_everything_through_a_member_kill_and_a_coordinator_kill(
    cluster: tuple[ClusterState, dict[int, subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    state, procs = cluster
    members: list[Member] = []
    try:
        asyncio.run(asyncio.wait_for(scenario(state, procs, members, tmp_path), 240))
    finally:
        stop_by_pid(members)


async def scenario(
    state: ClusterState,
    procs: dict[int, subprocess.Popen[bytes]],
    members: list[Member],
    logs: Path,
) -> None:
    credentials = state.client_credentials()
    bootstrap = state.broker_addresses()
    async with MetadataClient(
        [n.address for n in state.nodes], timeout_s=10.0, credentials=credentials
    ) as controller:
        created = await controller.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])
        assert created.topics[0].error == 0, created
    admin = GroupAdmin(bootstrap, credentials=credentials, timeout_ms=2_000)
    offsets = Offsets(admin, members)
    poller = asyncio.ensure_future(offsets.run())
    config = ProducerConfig(linger_ms=0, delivery_timeout_ms=90_000)
    producer = Producer(bootstrap, config, credentials=credentials)
    try:
        first = [Member(name, state, logs) for name in ("a", "b", "c")]
        members.extend(first)
        produced = await first_phase(state, procs, first, producer)
        # Every record produced was printed by some member.
        assert missing(produced, first) == [], "records no member printed"
        for m in first:
            _, commits = m.seen()
            by_partition: dict[int, list[int]] = {}
            for c in commits:
                by_partition.setdefault(c["partition"], []).append(c["offset"])
            # A member's own acknowledged commits of a partition never go back.
            for p, seq in by_partition.items():
                assert seq == sorted(seq), f"member {m.name}, partition {p}: commits {seq}"
            # Only a killed member's last line may be cut short.
            assert m.garbage[: -1 if m.killed else None] == [], (m.name, m.garbage)
        # No acknowledged commit is missing from the group, none went back,
        # and leaving committed everything the members printed.
        acked = acknowledged_commits(first)
        stored = await wait_until(offsets.read, "an OffsetFetch answer")
        offsets.check()
        ends = {p: 1 + max(o for q, o in produced if q == p) for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            assert stored.get(p, -1) >= acked.get(p, -1), (p, stored, acked)
        assert stored == ends, f"committed {stored} after leaving, log ends {ends}"
        last_commit = {p: max(acked.get(p, -1), stored[p]) for p in range(PARTITIONS)}

        # -- second phase: new members resume from the commits ---------------------
        second = [Member(name, state, logs) for name in ("d", "e", "f")]
        members.extend(second)
        await wait_until(lambda: sharing(admin, second), "the new members sharing the partitions")
        more = await produce_batch(producer, SECOND)
        await wait_until(lambda: not missing(more, second), "every new record printed")
        terminate(second)
        for m in second:
            records, _ = m.seen()
            first_read: dict[int, int] = {}
            for r in records:
                first_read.setdefault(r["partition"], r["offset"])
            for p, offset in first_read.items():
                assert offset >= last_commit[p], (
                    f"member {m.name} started partition {p} at {offset}, before the group's "
                    f"last acknowledged commit {last_commit[p]}"
                )
            assert m.garbage == [], (m.name, m.garbage)
        # Nothing of the first phase was read again: it had all been committed.
        again = [k for k in printed(second) if k not in more]
        assert again == [], f"records read again after the commits: {again[:10]}"
        assert missing(more, second) == []
        await offsets.read()
        offsets.check()
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await producer.close(5)
        await admin.close()


async def sharing(admin: GroupAdmin, members: list[Member]) -> bool:
    """Whether the group has as many members as ``members``, each holding
    partitions (so each process is in the group, its SIGTERM handler set)."""
    for m in members:
        assert m.proc.poll() is None, f"member {m.name} exited:\n{m.stderr()}"
    try:
        group = await admin.describe_group(GROUP)
    except BrokerClientError:
        return False
    return len(group.members) == len(members) and all(m.assignment for m in group.members)


async def produce_batch(producer: Producer, count: int) -> dict[tuple[int, int], str]:
    sent = [await send(producer, "second", i) for i in range(count)]
    return await acknowledged(sent)


async def send(
    producer: Producer, phase: str, i: int
) -> tuple[str, asyncio.Future[RecordMetadata]]:
    """The ``i``-th record of ``phase``, to partition ``i`` mod 6."""
    value = f"{phase}-{i:05d}"
    return value, await producer.send(TOPIC, value.encode(), partition=i % PARTITIONS)


async def acknowledged(
    sent: list[tuple[str, asyncio.Future[RecordMetadata]]],
) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for value, future in sent:
        meta = await asyncio.wait_for(future, WAIT_S + 30)
        out[(meta.partition, meta.offset)] = value
    return out


async def first_phase(
    state: ClusterState,
    procs: dict[int, subprocess.Popen[bytes]],
    members: list[Member],
    producer: Producer,
) -> dict[tuple[int, int], str]:
    """Produce while a member and then the coordinator's broker are killed
    (and the broker started again); every record acknowledged, by
    (partition, offset), once the survivors printed each partition to its
    end and stopped (SIGTERM)."""
    faults_done = asyncio.Event()
    sent: list[tuple[str, asyncio.Future[RecordMetadata]]] = []

    async def produce() -> None:
        stop_at: float | None = None
        while len(sent) < MOST and (stop_at is None or time.monotonic() < stop_at):
            if stop_at is None and faults_done.is_set():
                stop_at = time.monotonic() + 2.0
            sent.append(await send(producer, "first", len(sent)))
            await asyncio.sleep(EVERY_S)

    producing = asyncio.ensure_future(produce())
    try:
        # The group is formed and committing: every member printed a commit.
        await wait_until(
            lambda: all(m.seen()[1] or m.proc.poll() is not None for m in members),
            lambda: "a commit printed by every member; " + "; ".join(m.summary() for m in members),
        )
        for m in members:
            assert m.proc.poll() is None, f"member {m.name} exited:\n{m.stderr()}"
        victim, survivors = members[0], members[1:]
        victim.kill()
        await asyncio.sleep(1.0)
        # The coordinator's broker, killed by its pid.
        coordinator = await find_coordinator(state)
        proc = procs.pop(coordinator)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
        state.broker(coordinator).pid = None
        state.save()
        killed_at = {m.name: len(m.seen()[1]) for m in survivors}
        await find_coordinator(state, other_than=coordinator)
        # The survivors commit again, at the new coordinator.
        await wait_until(
            lambda: all(len(m.seen()[1]) > killed_at[m.name] for m in survivors),
            lambda: (
                "a commit acknowledged to each survivor after the coordinator's broker "
                f"died (before: {killed_at}); " + "; ".join(m.summary() for m in survivors)
            ),
        )
        procs.update(await start_brokers(state, [state.broker(coordinator)], WAIT_S))
        faults_done.set()
        await asyncio.wait_for(producing, WAIT_S)
    finally:
        faults_done.set()
        if not producing.done():
            producing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producing
    produced = await acknowledged(sent)
    ends = {p: max(o for q, o in produced if q == p) for p in range(PARTITIONS)}

    def at_the_end() -> bool:
        seen = printed(survivors)
        return all((p, end) in seen for p, end in ends.items())

    await wait_until(at_the_end, "the survivors printing every partition to its end")
    terminate(survivors)
    return produced


async def find_coordinator(state: ClusterState, other_than: int | None = None) -> int:
    """The group's coordinator as a running broker names it
    (FindCoordinator), once it is another broker than ``other_than``."""
    deadline = time.monotonic() + WAIT_S
    answers = []
    while True:
        for b in state.brokers:
            if b.pid is None:
                continue
            try:
                async with dial(b.address, state.client_credentials()) as channel:
                    answer = await groups_pb2_grpc.GroupServiceStub(channel).FindCoordinator(
                        groups_pb2.FindCoordinatorRequest(group_ids=[GROUP]), timeout=2
                    )
            except grpc.aio.AioRpcError as error:
                answers.append(f"broker {b.node_id}: {error.code().name}")
                continue
            found = answer.coordinators[0] if answer.coordinators else None
            if found is not None and found.error == Errors.NONE and found.node_id != other_than:
                return int(found.node_id)
            answers.append(f"broker {b.node_id}: {answer}")
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no coordinator of {GROUP} other than {other_than} within {WAIT_S:g} s: "
                f"{answers[-3:]}"
            )
        await asyncio.sleep(0.2)

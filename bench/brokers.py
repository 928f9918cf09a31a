"""The brokers' benchmark: produce latency, throughput, end-to-end latency,
leader failover and fencing a broker that leads many partitions, on a local
cluster of 3 controllers and 3 brokers (``kq cluster up``, mutual TLS, the
admin's certificate), driven by kq's gRPC client library. Every topic has
replication factor 3 and ``min.insync.replicas`` 2; every producer but the
acks=1 one is idempotent with acks=all.

* ``sequential``: one record at a time (``linger.ms`` 0, each send awaited)
  to one partition, 100-byte and 1 KiB values, acks=all and acks=1; the
  peer, in the same rounds (the series take turns a slice at a time, so all
  see the same load), is the quorum's own commit: a sequential key-value
  Put of the same size to the controllers (``KvClient``), replicated to a
  majority and fsynced before its answer.
* ``throughput``: ``producers`` load processes (``bench/broker_load.py``),
  each one batching producer (``linger.ms`` 5, ``batch.size`` 64 KiB, null
  keys: the sticky partitioner) sending back to back to a topic of
  ``partitions`` partitions (leaders spread over the brokers); records/s of
  100-byte and MB/s (10^6 bytes) of 1 KiB values acknowledged inside a
  common window after a warm-up.
* ``e2e``: an open-loop producer (sends scheduled by the clock at a fixed
  rate, each carrying its scheduled instant; a late send is sent at once
  and still measured from its schedule, as the OpenMessaging Benchmark)
  and a consumer process reading every partition from the end; latency
  from the scheduled send to the record's arrival at the consumer.
* ``failover``: a producer sends a record every 10 ms to a one-partition
  topic; SIGKILL of the partition's leader; the time to the first
  acknowledgement of a record sent after the kill (necessarily by the new
  leader), and to the brokers' metadata naming another leader; the killed
  broker is restarted and back in the ISR before the next trial.
* ``fence``: topics whose partitions all have the first broker as
  preferred leader (``fence_partitions`` in all, created through the
  controllers, each then written once); the brokers' resident memory before
  and after; SIGKILL of that broker, then the times to the controller
  fencing it (its session expires: ``broker_session_timeout_ms``), to every
  one of those partitions led elsewhere in the brokers' metadata, and to
  every one of them accepting an acks=all write (one record per partition,
  sent at the kill and retried by the producer as a user's would be).

```sh
.venv/bin/python bench/brokers.py --preset full [--only sequential,e2e] [--json]
.venv/bin/python bench/brokers.py --preset small   # tens of seconds
```
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.broker_load import stamped_value
from bench.harness import _git_commit, latency_summary, make_value, percentile
from broker.client.producer_batch import Acks, ProducerConfig, TopicPartition
from broker.grpc_client.admin import Admin
from broker.grpc_client.metadata_cache import PartitionInfo
from broker.grpc_client.producer import Producer
from kqproto import metadata_pb2
from kvstore.client import KvClient
from metadata.client import MetadataClient, NewTopic
from server.local_brokers import start_brokers
from server.local_cluster import ClusterState, free_base_port, load_state, run_kq

BENCH_DIR = Path(__file__).resolve().parent
SECTIONS = ("sequential", "throughput", "e2e", "failover", "fence")
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
# The most partitions one CreateTopics may carry (the controller writes a
# request's records as one batch of at most 10,000 records).
CREATE_CHUNK = 1_000


@dataclass(frozen=True)
class Preset:
    seq_records: int  # per series
    seq_slices: int  # the series take turns this many times
    tput_producers: int
    tput_partitions: int
    tput_warmup_s: float
    tput_duration_s: float
    e2e_rate: int  # records/s
    e2e_duration_s: float
    e2e_partitions: int
    failover_trials: int
    fence_partitions: int
    # How long the brokers' CPU is sampled with the fence topics idle.
    idle_window_s: float
    # The controllers' broker.session.timeout.ms (Kafka's default 9,000).
    session_timeout_ms: int


PRESETS = {
    "small": Preset(
        seq_records=40,
        seq_slices=2,
        tput_producers=1,
        tput_partitions=3,
        tput_warmup_s=0.5,
        tput_duration_s=1.5,
        e2e_rate=100,
        e2e_duration_s=1.5,
        e2e_partitions=3,
        failover_trials=1,
        fence_partitions=30,
        idle_window_s=1.0,
        session_timeout_ms=3_000,
    ),
    "full": Preset(
        seq_records=2_000,
        seq_slices=10,
        tput_producers=2,
        tput_partitions=6,
        tput_warmup_s=2.0,
        tput_duration_s=15.0,
        e2e_rate=1_000,
        e2e_duration_s=30.0,
        e2e_partitions=3,
        failover_trials=20,
        # 2,000 did not hold here: creating them blocked the brokers' event
        # loops past their session (docs/benchmarks.md, Brokers).
        fence_partitions=1_000,
        idle_window_s=5.0,
        session_timeout_ms=9_000,
    ),
}


def now() -> float:
    return time.monotonic()


def rss_mib(pid: int | None) -> float | None:
    """The resident memory of a process (VmRSS), None if it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU time of a process so far, None if it is gone."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    # utime and stime are fields 14 and 15 of proc(5), 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_cpu(cluster: Cluster, window_s: float) -> dict[str, float | None]:
    """Each broker's CPU use (cores) over ``window_s`` with no client load."""
    pids = {n: p for n, p in cluster.pids().items() if n.startswith("broker-")}
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    await asyncio.sleep(window_s)
    out: dict[str, float | None] = {}
    for name, pid in pids.items():
        start, end = before[name], cpu_seconds(pid)
        out[name] = None if start is None or end is None else round((end - start) / window_s, 3)
    return out


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --------------------------------------------------------------------------
# The cluster


class Cluster:
    """A running local cluster and the admin's clients to it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._children: list[subprocess.Popen[bytes]] = []

    @property
    def state(self) -> ClusterState:
        state = load_state(self.dir)
        if state is None:
            raise RuntimeError(f"no cluster state in {self.dir}")
        return state

    @property
    def brokers(self) -> list[str]:
        return self.state.broker_addresses()

    @property
    def controllers(self) -> list[str]:
        return [n.address for n in self.state.nodes]

    def credentials(self) -> Any:
        return self.state.client_credentials()

    def pids(self) -> dict[str, int | None]:
        state = self.state
        out: dict[str, int | None] = {f"controller-{n.node_id}": n.pid for n in state.nodes}
        out.update({f"broker-{b.node_id}": b.pid for b in state.brokers})
        return out

    def broker_pid(self, broker_id: int) -> int:
        pid = self.state.broker(broker_id).pid
        if pid is None:
            raise RuntimeError(f"broker {broker_id} is not running")
        return pid

    def kill_broker(self, broker_id: int) -> None:
        os.kill(self.broker_pid(broker_id), signal.SIGKILL)

    async def restart_broker(self, broker_id: int) -> None:
        state = self.state
        procs = await start_brokers(state, [state.broker(broker_id)], 60)
        self._children.extend(procs.values())

    def reap(self) -> None:
        for proc in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0)

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        assignments: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        async with MetadataClient(
            self.controllers, credentials=self.credentials(), timeout_s=60
        ) as admin:
            topic = (
                NewTopic(name, assignments=assignments, configs=TOPIC_CONFIGS)
                if assignments
                else NewTopic(name, partitions, 3, configs=TOPIC_CONFIGS)
            )
            created = await admin.create_topics([topic])
            error = created.topics[0]
            if error.error != 0:
                raise RuntimeError(f"creating topic {name}: {error}")

    async def wait_topics(
        self, names: Sequence[str], timeout_s: float, ok: Callable[[PartitionInfo], bool]
    ) -> dict[str, list[PartitionInfo]]:
        """Wait until every partition of ``names`` passes ``ok`` in the
        brokers' metadata; the partitions."""
        deadline = now() + timeout_s
        async with Admin(self.brokers, credentials=self.credentials(), timeout_ms=10_000) as admin:
            while True:
                found: dict[str, list[PartitionInfo]] = {}
                with contextlib.suppress(Exception):
                    for name in names:
                        found[name] = await admin.topic(name)
                if len(found) == len(names) and all(
                    ok(p) for parts in found.values() for p in parts
                ):
                    return found
                if now() > deadline:
                    raise RuntimeError(f"topics {list(names)} not ready within {timeout_s} s")
                await asyncio.sleep(0.1)


def fully_replicated(p: PartitionInfo) -> bool:
    return p.leader >= 0 and len(p.isr) == len(p.replicas) == 3


@contextlib.asynccontextmanager
async def local_cluster(
    directory: Path, session_timeout_ms: int, settings: Mapping[str, object] | None = None
) -> AsyncIterator[Cluster]:
    """3 controllers and 3 brokers (mutual TLS) with the controllers'
    ``broker_session_timeout_ms`` and ``settings`` (``kq cluster up --set``
    keys, e.g. ``group.session_timeout_ms``)."""
    extra = [a for key, value in (settings or {}).items() for a in ("--set", f"{key}={value}")]
    up = await asyncio.to_thread(
        run_kq,
        "cluster", "up", "--dir", str(directory), "--nodes", "3", "--brokers", "3",
        "--base-port", str(free_base_port(3, brokers=3)),
        "--set", f"controller.broker_session_timeout_ms={session_timeout_ms}",
        *extra,
        "--timeout", "90", "--json",
        timeout_s=300,
    )  # fmt: skip
    cluster = Cluster(directory)
    try:
        if up.returncode != 0:
            raise RuntimeError(f"kq cluster up failed: {up.stderr.strip() or up.stdout.strip()}")
        yield cluster
    finally:
        await asyncio.to_thread(run_kq, "cluster", "down", "--dir", str(directory), timeout_s=120)
        state = load_state(directory)
        for member in state.members if state else []:
            if member.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(member.pid, signal.SIGKILL)
        cluster.reap()


# --------------------------------------------------------------------------
# Sequential produce latency, beside the quorum's commit


def sequential_producer(cluster: Cluster, acks: Acks) -> Producer:
    config = ProducerConfig(acks=acks, enable_idempotence=acks is Acks.ALL, linger_ms=0)
    return Producer(cluster.brokers, config, credentials=cluster.credentials())


async def sequential(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic = "bench-sequential"
    await cluster.create_topic(topic, 1)
    await cluster.wait_topics([topic], 60, fully_replicated)
    producers = {
        "all": sequential_producer(cluster, Acks.ALL),
        "1": sequential_producer(cluster, Acks.LEADER),
    }
    kv = KvClient(cluster.controllers, timeout_s=10, credentials=cluster.credentials())
    latencies: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    counter = 0

    async def one(series: str, value: bytes) -> None:
        nonlocal counter
        counter += 1
        if series.startswith("kv"):
            await kv.put(f"bench/seq/{counter % 10_000}", value)
        else:
            producer = producers[series.split("-")[1]]
            await (await producer.send(topic, value, partition=0))

    sizes = (100, 1024)
    series_names = [f"{kind}-{size}" for size in sizes for kind in ("acks-all", "acks-1", "kv-put")]
    try:
        for name in series_names:  # warm-up: channels, producer id, caches
            kind, size = name.rsplit("-", 1)
            for _ in range(10):
                await asyncio.wait_for(one(kind.replace("acks-", "p-"), make_value(int(size))), 30)
        per_slice = max(1, preset.seq_records // preset.seq_slices)
        for _ in range(preset.seq_slices):
            for name in series_names:
                kind, size = name.rsplit("-", 1)
                value = make_value(int(size))
                series = kind.replace("acks-", "p-")
                for _ in range(per_slice):
                    t0 = time.perf_counter()
                    try:
                        await asyncio.wait_for(one(series, value), 10)
                    except Exception:
                        errors[name] = errors.get(name, 0) + 1
                        continue
                    latencies.setdefault(name, []).append(time.perf_counter() - t0)
    finally:
        for producer in producers.values():
            await producer.close(timeout_s=10)
        await kv.close()
    out: dict[str, Any] = {}
    for name in series_names:
        got = latencies.get(name, [])
        out[name] = {"writes": len(got), "errors": errors.get(name, 0), **latency_summary(got)}
    return out


# --------------------------------------------------------------------------
# Throughput


def load_command(*args: str) -> list[str]:
    return [sys.executable, str(BENCH_DIR / "broker_load.py"), *args]


async def run_loads(commands: Sequence[list[str]], timeout_s: float) -> list[dict[str, Any]]:
    """Run the load processes at once: each prints ``ready`` once connected,
    then all are given one start instant (so their windows coincide, however
    long each took to start on a loaded machine); each one's JSON line."""
    procs = [
        await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for cmd in commands
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), 120)
            if line.strip() != b"ready":
                _, stderr = await p.communicate()
                raise RuntimeError(f"a load process did not start: {stderr.decode()[-2000:]}")
        start = f"{now() + 0.5:.6f}\n".encode()
        outs = await asyncio.wait_for(
            asyncio.gather(*(p.communicate(start) for p in procs)), timeout_s
        )
    finally:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
    results = []
    for p, (stdout, stderr) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"load process failed ({p.returncode}): {stderr.decode()[-2000:]}")
        results.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return results


async def throughput(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    out: dict[str, Any] = {
        "producers": preset.tput_producers,
        "partitions": preset.tput_partitions,
        "linger_ms": 5,
        "batch_size": 65_536,
    }
    for size in (100, 1024):
        topic = f"bench-throughput-{size}"
        await cluster.create_topic(topic, preset.tput_partitions)
        await cluster.wait_topics([topic], 60, fully_replicated)
        commands = [
            load_command(
                "produce",
                "--cluster-dir",
                str(cluster.dir),
                "--topic",
                topic,
                "--size",
                str(size),
                "--warmup",
                str(preset.tput_warmup_s),
                "--duration",
                str(preset.tput_duration_s),
                "--linger-ms",
                "5",
                "--batch-size",
                "65536",
            )  # fmt: skip
            for _ in range(preset.tput_producers)
        ]
        results = await run_loads(commands, 60 + preset.tput_warmup_s + preset.tput_duration_s + 30)
        records = sum(r["records"] for r in results)
        seconds = preset.tput_duration_s
        out[f"size_{size}"] = {
            "records": records,
            "seconds": seconds,
            "records_per_s": records / seconds,
            "mb_per_s": records * size / seconds / 1e6,
            "failed": sum(r["failed"] for r in results),
            "per_producer_records_per_s": [r["records"] / seconds for r in results],
            "last_error": next((r["last_error"] for r in results if r["last_error"]), None),
        }
    return out


# --------------------------------------------------------------------------
# End-to-end latency at a fixed rate


async def end_to_end(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic = "bench-e2e"
    size = 100
    await cluster.create_topic(topic, preset.e2e_partitions)
    await cluster.wait_topics([topic], 60, fully_replicated)
    count = int(preset.e2e_rate * preset.e2e_duration_s)
    until = now() + 30 + preset.e2e_duration_s + 20
    consumer = await asyncio.create_subprocess_exec(
        *load_command(
            "consume",
            "--cluster-dir",
            str(cluster.dir),
            "--topic",
            topic,
            "--expect",
            str(count),
            "--until",
            f"{until:.6f}",
        ),  # fmt: skip
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    config = ProducerConfig(acks=Acks.ALL, linger_ms=1)
    producer = Producer(cluster.brokers, config, credentials=cluster.credentials())
    failed = 0
    lag: list[float] = []

    def settled(future: asyncio.Future[Any]) -> None:
        nonlocal failed
        if future.cancelled() or future.exception() is not None:
            failed += 1

    try:
        assert consumer.stdout is not None
        line = await asyncio.wait_for(consumer.stdout.readline(), 30)
        if line.strip() != b"ready":
            raise RuntimeError(f"the consumer did not start: {line!r}")
        await producer.metadata.partition_count(topic, 10_000)
        filler = make_value(size)
        t0 = now() + 0.2
        interval = 1.0 / preset.e2e_rate
        for i in range(count):
            scheduled = t0 + i * interval
            delay = scheduled - now()
            if delay > 0:
                await asyncio.sleep(delay)
            lag.append(max(0.0, now() - scheduled))
            future = await producer.send(topic, stamped_value(scheduled, size, filler))
            future.add_done_callback(settled)
        await producer.flush(30)
        stdout, stderr = await asyncio.wait_for(consumer.communicate(), until - now() + 10)
    finally:
        await producer.close(timeout_s=10)
        if consumer.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                consumer.kill()
            await consumer.wait()
    if consumer.returncode != 0:
        raise RuntimeError(f"the consumer failed: {stderr.decode()[-2000:]}")
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    return {
        "rate_per_s": preset.e2e_rate,
        "seconds": preset.e2e_duration_s,
        "record_bytes": size,
        "partitions": preset.e2e_partitions,
        "sent": count,
        "failed": failed,
        "send_lag_p99_ms": percentile(lag, 99) * 1e3 if lag else None,
        "send_lag_max_ms": max(lag) * 1e3 if lag else None,
        **result,
    }


# --------------------------------------------------------------------------
# Leader failover


async def failover(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic = "bench-failover"
    await cluster.create_topic(topic, 1)
    await cluster.wait_topics([topic], 60, fully_replicated)
    value = make_value(100)
    trials: list[dict[str, Any]] = []
    config = ProducerConfig(acks=Acks.ALL, linger_ms=0, request_timeout_ms=10_000)
    producer = Producer(cluster.brokers, config, credentials=cluster.credentials())
    try:
        await (await producer.send(topic, value, partition=0))
        for trial in range(preset.failover_trials):
            found = await cluster.wait_topics([topic], 120, fully_replicated)
            leader = found[topic][0].leader
            trials.append(await failover_trial(cluster, producer, topic, leader, value, trial))
            await cluster.restart_broker(leader)
            await cluster.wait_topics([topic], 120, fully_replicated)
    finally:
        await producer.close(timeout_s=10)
    recovered = [t["ack_s"] for t in trials if t["ack_s"] is not None]
    moved = [t["metadata_s"] for t in trials if t["metadata_s"] is not None]
    return {
        "trials": len(trials),
        "recovered": len(recovered),
        "session_timeout_ms": preset.session_timeout_ms,
        "ack_p50_ms": percentile(recovered, 50) * 1e3 if recovered else None,
        "ack_p99_ms": percentile(recovered, 99) * 1e3 if recovered else None,
        "ack_max_ms": max(recovered) * 1e3 if recovered else None,
        "metadata_p50_ms": percentile(moved, 50) * 1e3 if moved else None,
        "per_trial": trials,
    }


async def failover_trial(
    cluster: Cluster, producer: Producer, topic: str, leader: int, value: bytes, trial: int
) -> dict[str, Any]:
    t_kill: float | None = None
    first_ack: float | None = None
    acked = asyncio.Event()
    stop = asyncio.Event()

    def on_ack(sent: float) -> Callable[[asyncio.Future[Any]], None]:
        def done(future: asyncio.Future[Any]) -> None:
            nonlocal first_ack
            if future.cancelled() or future.exception() is not None:
                return
            t = now()
            if t_kill is not None and sent >= t_kill and first_ack is None:
                first_ack = t
                acked.set()

        return done

    async def probes() -> None:
        while not stop.is_set():
            sent = now()
            future = await producer.send(topic, value, partition=0)
            future.add_done_callback(on_ack(sent))
            await asyncio.sleep(0.01)

    async def leader_moved() -> float | None:
        async with Admin(cluster.brokers, credentials=cluster.credentials(), timeout_ms=2_000) as a:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    parts = await a.topic(topic)
                    if parts[0].leader not in (-1, leader):
                        return now()
                await asyncio.sleep(0.02)
        return None

    probing = asyncio.ensure_future(probes())
    await asyncio.sleep(1.0)
    cluster.kill_broker(leader)
    t_kill = now()
    watching = asyncio.ensure_future(leader_moved())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(acked.wait(), 120)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(watching), 10)
    stop.set()
    await probing
    moved_at = await watching
    await producer.flush(30)
    return {
        "trial": trial,
        "killed": leader,
        "ack_s": None if first_ack is None else first_ack - t_kill,
        "metadata_s": None if moved_at is None else moved_at - t_kill,
    }


# --------------------------------------------------------------------------
# Fencing a broker that leads many partitions


async def fence(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    state = cluster.state
    ids = [b.node_id for b in state.brokers]
    victim, others = ids[0], ids[1:]
    sizes: dict[str, int] = {}
    pids = cluster.pids()
    rss_before = {name: rss_mib(pid) for name, pid in pids.items()}
    t_create = now()
    left = preset.fence_partitions
    while left > 0:
        size = min(CREATE_CHUNK, left)
        name = f"bench-fence-{len(sizes)}"
        assignments = {
            p: [victim, *(others if p % 2 == 0 else reversed(others))] for p in range(size)
        }
        await cluster.create_topic(name, assignments=assignments)
        sizes[name] = size
        left -= size
    names = list(sizes)
    t_created = now()
    await cluster.wait_topics(names, 1_800, fully_replicated)
    t_replicated = now()
    tps = [TopicPartition(name, p) for name, size in sizes.items() for p in range(size)]
    config = ProducerConfig(acks=Acks.ALL, linger_ms=5, delivery_timeout_ms=600_000)
    value = make_value(100)
    async with Producer(cluster.brokers, config, credentials=cluster.credentials()) as producer:
        await write_each(producer, tps, value, 600)
        t_written = now()
        rss_after = {name: rss_mib(pid) for name, pid in cluster.pids().items()}
        cpu_idle = await idle_cpu(cluster, preset.idle_window_s)
        found = await cluster.wait_topics(names, 60, fully_replicated)
        led_after_creation = sum(1 for ps in found.values() for p in ps if p.leader == victim)
        if led_after_creation < len(tps):
            # Leadership moved while the partitions were made (a broker
            # whose heartbeats were late on a loaded machine is fenced and
            # its partitions elect others); a preferred election gives them
            # back (Kafka's auto.leader.rebalance does so every 5 minutes).
            async with MetadataClient(
                cluster.controllers, credentials=cluster.credentials(), timeout_s=120
            ) as admin:
                await admin.elect_leaders(metadata_pb2.PREFERRED)
            with contextlib.suppress(RuntimeError):
                await cluster.wait_topics(
                    names, 120, lambda p: fully_replicated(p) and p.leader == victim
                )
            found = await cluster.wait_topics(names, 120, lambda p: p.leader >= 0)
        led = sum(1 for parts in found.values() for p in parts if p.leader == victim)

        cluster.kill_broker(victim)
        t_kill = now()
        writes = asyncio.ensure_future(write_each(producer, tps, value, 600))
        t_fenced = await wait_fenced(cluster, victim, 600)
        found = await cluster.wait_topics(names, 600, lambda p: p.leader not in (-1, victim))
        t_moved = now()
        await writes
        t_writable = now()
    still_led = sum(1 for parts in found.values() for p in parts if p.leader == victim)
    return {
        "partitions": preset.fence_partitions,
        "topics": len(names),
        "led_by_victim": led,
        "led_by_victim_after_creation": led_after_creation,
        "still_led_after": still_led,
        "session_timeout_ms": preset.session_timeout_ms,
        "create_s": t_created - t_create,
        "create_to_replicated_s": t_replicated - t_create,
        "first_writes_s": t_written - t_replicated,
        "rss_mib_before": rss_before,
        "rss_mib_after": rss_after,
        "idle_cpu_cores": cpu_idle,
        "idle_window_s": preset.idle_window_s,
        "kill_to_fenced_s": t_fenced - t_kill,
        "kill_to_led_elsewhere_s": t_moved - t_kill,
        "kill_to_all_writable_s": t_writable - t_kill,
        "fenced_to_led_elsewhere_s": t_moved - t_fenced,
        "fenced_to_all_writable_s": t_writable - t_fenced,
    }


async def write_each(
    producer: Producer, tps: Sequence[TopicPartition], value: bytes, timeout_s: float
) -> None:
    """One acks=all record to each partition, all acknowledged."""
    futures = [await producer.send(tp.topic, value, partition=tp.partition) for tp in tps]
    await producer.flush(timeout_s)
    failed = [f for f in futures if not f.done() or f.exception() is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(futures)} writes were not acknowledged")


async def wait_fenced(cluster: Cluster, broker_id: int, timeout_s: float) -> float:
    deadline = now() + timeout_s
    async with MetadataClient(
        cluster.controllers, credentials=cluster.credentials(), timeout_s=2
    ) as admin:
        while now() < deadline:
            with contextlib.suppress(Exception):
                answer = await admin.describe_cluster(linearizable=False)
                if any(b.broker_id == broker_id and b.fenced for b in answer.brokers):
                    return now()
            await asyncio.sleep(0.05)
    raise RuntimeError(f"broker {broker_id} was not fenced within {timeout_s} s")


# --------------------------------------------------------------------------
# Running and reporting

RUNNERS = {
    "sequential": sequential,
    "throughput": throughput,
    "e2e": end_to_end,
    "failover": failover,
    "fence": fence,
}


async def run(
    preset_name: str,
    only: Sequence[str],
    directory: Path | None,
    fence_partitions: int | None = None,
) -> dict[str, Any]:
    preset = PRESETS[preset_name]
    if fence_partitions is not None:
        preset = dataclasses.replace(preset, fence_partitions=fence_partitions)
    return await run_sections(
        "brokers", preset_name, preset, RUNNERS, only, directory, preset.session_timeout_ms
    )


async def run_sections(
    benchmark: str,
    preset_name: str,
    preset: Any,
    runners: Mapping[str, Callable[[Cluster, Any], Awaitable[dict[str, Any]]]],
    only: Sequence[str],
    directory: Path | None,
    session_timeout_ms: int,
    settings: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The sections ``only`` of ``runners`` on one local cluster (in
    ``directory``, or a temporary folder removed after), each one's figures
    or its error, under the run's header (commit, machine, preset, load)."""
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix=f"kq-bench-{benchmark}-")) if owned else directory
    assert root is not None
    doc: dict[str, Any] = {
        "benchmark": benchmark,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "preset": preset_name,
        "params": dataclasses.asdict(preset),
        "load_average_start": load_average(),
        "sections": {},
    }
    try:
        async with local_cluster(root / "cluster", session_timeout_ms, settings) as cluster:
            for name in only:
                t0 = now()
                try:
                    doc["sections"][name] = await runners[name](cluster, preset)
                except Exception as error:
                    # The other sections' figures are kept; this one says why.
                    doc["sections"][name] = {"error": f"{type(error).__name__}: {error}"}
                doc["sections"][name]["wall_s"] = round(now() - t0, 1)
                doc["sections"][name]["load_average"] = load_average()
                print(f"# {name} done in {now() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    doc["load_average_end"] = load_average()
    return doc


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def text_head(benchmark: str, doc: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """A benchmark's text report's first lines (what ran where, the sections
    that failed) and the sections that did not fail, by name."""
    lines = [
        f"{benchmark} benchmark, preset {doc['preset']}, commit {doc['git_commit']}, "
        f"load average {doc['load_average_start']} -> {doc['load_average_end']}"
    ]
    for name, section in doc["sections"].items():
        if "error" in section:
            lines.append(f"== {name}: failed: {section['error']}")
    return lines, {k: v for k, v in doc["sections"].items() if "error" not in v}


def format_text(doc: dict[str, Any]) -> str:
    lines, s = text_head("brokers", doc)
    if "sequential" in s:
        lines.append("== sequential produce (p50 / p99 ms), peer: the quorum's KV put")
        for name, r in s["sequential"].items():
            if isinstance(r, dict):
                lines.append(
                    f"   {name:<14} {_ms(r['p50_ms']):>8} / {_ms(r['p99_ms']):>8}"
                    f"   ({r['writes']} writes, {r['errors']} errors)"
                )
    if "throughput" in s:
        t = s["throughput"]
        lines.append(
            f"== throughput ({t['producers']} producers, {t['partitions']} partitions, "
            f"linger {t['linger_ms']} ms, batch {t['batch_size']} B)"
        )
        for size in (100, 1024):
            r = t[f"size_{size}"]
            lines.append(
                f"   {size:>5} B: {r['records_per_s']:>10,.0f} records/s "
                f"{r['mb_per_s']:>7.2f} MB/s ({r['failed']} failed)"
            )
    if "e2e" in s:
        r = s["e2e"]
        lines.append(
            f"== end to end at {r['rate_per_s']}/s for {r['seconds']} s: p50 "
            f"{_ms(r.get('p50_ms'))}, p99 {_ms(r.get('p99_ms'))}, p99.9 {_ms(r.get('p999_ms'))}, "
            f"max {_ms(r.get('max_ms'))} ms ({r['records']} of {r['sent']} received, "
            f"{r['duplicates']} duplicates; send lag p99 {_ms(r['send_lag_p99_ms'])} ms)"
        )
    if "failover" in s:
        r = s["failover"]
        lines.append(
            f"== failover ({r['recovered']}/{r['trials']} trials, session timeout "
            f"{r['session_timeout_ms']} ms): first ack p50 {_ms(r['ack_p50_ms'])}, p99 "
            f"{_ms(r['ack_p99_ms'])} ms; metadata p50 {_ms(r['metadata_p50_ms'])} ms"
        )
    if "fence" in s:
        r = s["fence"]
        lines.append(
            f"== fence of a broker leading {r['led_by_victim']} partitions: created in "
            f"{r['create_to_replicated_s']:.1f} s; kill -> fenced {r['kill_to_fenced_s']:.2f} s, "
            f"-> led elsewhere {r['kill_to_led_elsewhere_s']:.2f} s, -> all writable "
            f"{r['kill_to_all_writable_s']:.2f} s"
        )
        lines.append(f"   RSS MiB before {r['rss_mib_before']}")
        lines.append(f"   RSS MiB after  {r['rss_mib_after']}")
        lines.append(f"   idle CPU (cores) with them {r['idle_cpu_cores']}")
    return "\n".join(lines)


def only_parser(sections: Sequence[str]) -> Callable[[str], list[str]]:
    """``--only``'s type: a comma-separated choice of ``sections``, in
    their order."""

    def parse(text: str) -> list[str]:
        chosen = [w.strip() for w in text.split(",") if w.strip()]
        unknown = [w for w in chosen if w not in sections]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"unknown section(s) {', '.join(unknown) or '(none given)'}; known: "
                + ", ".join(sections)
            )
        return [s for s in sections if s in chosen]

    return parse


parse_only = only_parser(SECTIONS)


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def bench_parser(
    description: str, presets: Sequence[str], sections: Sequence[str]
) -> argparse.ArgumentParser:
    """The arguments every cluster benchmark takes: ``--preset``,
    ``--only``, ``--dir``, ``--json``, ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--preset", choices=sorted(presets), default="small")
    parser.add_argument("--only", type=only_parser(sections), default=list(sections))
    parser.add_argument("--dir", type=Path, help="the cluster's folder (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON document here")
    return parser


def parse_bench_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> Any:
    args = parser.parse_args(argv)
    if args.dir is not None and args.dir.exists() and any(args.dir.iterdir()):
        parser.error(f"--dir {args.dir} is not empty: give a new or empty folder")
    return args


def report(args: Any, doc: dict[str, Any], text: Callable[[dict[str, Any]], str]) -> int:
    """Print the run (JSON with ``--json``, else ``text(doc)``), write it to
    ``--out``; the exit status: 1 if a section failed."""
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return 1 if any("error" in section for section in doc["sections"].values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__.split("\n\n")[0], list(PRESETS), SECTIONS)
    parser.add_argument(
        "--fence-partitions",
        type=positive,
        help="partitions the fenced broker leads (default: the preset's)",
    )
    args = parse_bench_args(parser, argv)
    doc = asyncio.run(run(args.preset, args.only, args.dir, args.fence_partitions))
    return report(args, doc, format_text)


if __name__ == "__main__":
    sys.exit(main())

"""Metadata controller benchmarks: topic creation, fencing, image memory, snapshots.

Every figure has a peer measured in the same run (machines are shared and
noisy), and ``ratio`` is always *our cost / the peer's cost* for the same
work: 1.0 would be as cheap as the peer, 5.0 five times as costly.

* ``topics``: topic creation on the pure controller path, one CreateTopics
  request at a time (many 10-partition topics, then one topic of 9,999
  partitions, the most one request may create): the decision
  (``Controller.create_topics``), encoding the records, the speculative
  replay (``Controller.replay``) and the committed replay
  (``ControllerStateMachine.handle_commit``: decode, digest, delta,
  image).  Peer: msgpack packing and unpacking the same records' field
  lists, the floor cost of the bytes alone.
* ``quorum``: the same through a real 3-node quorum on loopback, all three
  nodes in this process (``server.controller.controller_server``), 10 brokers
  registered and heartbeating, N concurrent CreateTopics callers on one
  ``MetadataClient``.  Peer: kq's own KV Put rate with the same N callers on
  one ``KvClient``, same cluster, right after.  Then one 9,999-partition
  topic, against one PutMany of as many values.
* ``fence``: a 100,000-partition image over 10 brokers (RF 3, built by
  replaying records into a ``MetadataDelta``); one broker's session expires
  and the time from the decision (``Controller.fence_expired``) until the
  committed image shows no partition led by it: decide, encode, speculative
  and committed replay, in batches as ``QuorumController`` cuts them.  Peer:
  replaying the same PartitionChangeRecords alone into one delta.
* ``fence-quorum``: the same on a real in-process 3-node quorum: the
  partitions are bulk-proposed as records, 10 brokers heartbeat, one stops;
  from the fence decision until the leader's (and every node's) committed
  image shows the broker fenced and leading nothing.  Same peer.
* ``memory``: tracemalloc growth while building images of 10,000 and
  100,000 partitions, per partition.  Peer: the same partitions as plain
  tuples in a list.
* ``snapshot``: ``encode_snapshot``/``decode_snapshot`` of the
  100,000-partition image.  Peer: msgpack packing/unpacking the same number
  of plain lists (each record's fields).

    .venv/bin/python bench/metadata_bench.py [SECTION ...] [--quick] [--repeat R] [--json]
    .venv/bin/python bench/metadata_bench.py quorum snapshot fence --profile --repeat 1
    .venv/bin/python bench/metadata_bench.py topics --size large_topic_partitions=5000

``--quick`` runs small sizes (well under 20 s); no section named: all.
``--size NAME=VALUE`` changes one field of :class:`Sizes`.  Every timed part
starts after a ``gc.collect()``; the snapshot section pauses the collector
while timing (see :func:`paused_gc`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import cProfile
import dataclasses
import gc
import io
import json
import pstats
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metadata.active import batch_bounds
from metadata.controller import (
    SUPPORTED_FEATURES,
    Controller,
    ControllerOptions,
    ControllerResult,
    HeartbeatRequest,
    NewTopic,
    RegisterRequest,
)
from metadata.delta import MetadataDelta
from metadata.errors import Errors
from metadata.image import EMPTY_IMAGE, MetadataImage
from metadata.placement import UsableBroker, place
from metadata.records import (
    Endpoint,
    FeatureLevelRecord,
    FeatureRange,
    PartitionChangeRecord,
    PartitionRecord,
    Record,
    RegisterBrokerRecord,
    TopicRecord,
    encode_record,
)
from metadata.state_machine import ControllerStateMachine, decode_snapshot, encode_snapshot
from quorum.driver.node import NodeOptions
from quorum.types import Batch, SnapshotId
from server.local_cluster import free_base_port

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]

CLUSTER_ID = "kq-bench-metadata-0000"
FEATURES = tuple(FeatureRange(name, low, high) for name, (low, high) in SUPPORTED_FEATURES.items())
# QuorumController cuts a write into batches of at most these.
MAX_BATCH_RECORDS = NodeOptions().max_batch_records
MAX_BATCH_BYTES = NodeOptions().max_batch_bytes
EPOCH = 1

SECTIONS = ("topics", "quorum", "fence", "fence-quorum", "memory", "snapshot")


@dataclass(frozen=True)
class Sizes:
    brokers: int = 10
    replication_factor: int = 3
    # topics: this many topics of this many partitions, one per request
    topics: int = 1_000
    partitions_per_topic: int = 10
    # then one topic of this many partitions (one request may write at most
    # 10,000 records: the topic's and its partitions')
    large_topic_partitions: int = 9_999
    # fence and snapshot: an image of this many partitions in topics of
    # fence_topic_size partitions
    fence_partitions: int = 100_000
    fence_topic_size: int = 100
    memory_partitions: tuple[int, ...] = (10_000, 100_000)
    # quorum: concurrent callers, and seconds measured per point
    quorum_clients: tuple[int, ...] = (1, 8, 32)
    quorum_warmup_s: float = 1.0
    quorum_seconds: float = 8.0
    # how long to watch for a leader change after the large topic
    quorum_settle_s: float = 3.0
    quorum_fence_partitions: int = 100_000
    # the session timeout of the fence-quorum cluster's brokers
    quorum_session_ms: int = 9_000


FULL = Sizes()
QUICK = Sizes(
    topics=200,
    large_topic_partitions=2_000,
    fence_partitions=10_000,
    memory_partitions=(1_000, 10_000),
    quorum_clients=(1, 8),
    quorum_warmup_s=0.3,
    quorum_seconds=1.5,
    quorum_settle_s=1.0,
    quorum_fence_partitions=10_000,
    quorum_session_ms=1_500,
)


# -- building metadata fast -----------------------------------------------------


def topic_id(rng: random.Random) -> str:
    """A topic id as the controller makes them (16 random bytes, url-safe
    base64 without padding)."""
    return base64.urlsafe_b64encode(rng.getrandbits(128).to_bytes(16, "big")).rstrip(b"=").decode()


def incarnation(broker: int) -> str:
    """A broker's incarnation id (a Uuid, as topic ids are)."""
    return topic_id(random.Random(broker + 1))


def endpoint(broker: int) -> Endpoint:
    return Endpoint("PLAINTEXT", "127.0.0.1", 9092 + broker)


def layout(
    partitions: int, topic_size: int, brokers: int, rf: int, seed: int = 0
) -> Iterator[tuple[str, str, list[tuple[int, ...]]]]:
    """(name, topic id, replicas of each partition) of topics holding
    ``partitions`` partitions, placed as the controller places them."""
    rng = random.Random(seed)
    usable = [UsableBroker(b, None, False) for b in range(brokers)]
    done, t = 0, 0
    while done < partitions:
        count = min(topic_size, partitions - done)
        yield f"topic-{t:06d}", topic_id(rng), place(0, count, rf, usable, rng)
        done += count
        t += 1


def image_records(partitions: int, topic_size: int, brokers: int, rf: int) -> list[Record]:
    """The records of a cluster: the feature level, ``brokers`` unfenced
    brokers, then the topics and their partitions (leader: first replica,
    ISR: every replica)."""
    records: list[Record] = [
        FeatureLevelRecord(n, high) for n, (_, high) in SUPPORTED_FEATURES.items()
    ]
    for b in range(brokers):
        records.append(
            RegisterBrokerRecord(
                b, len(records), incarnation(b), (endpoint(b),), None, FEATURES, fenced=False
            )
        )
    records.extend(topic_records(partitions, topic_size, brokers, rf))
    return records


def topic_records(partitions: int, topic_size: int, brokers: int, rf: int) -> list[Record]:
    records: list[Record] = []
    for name, tid, assignment in layout(partitions, topic_size, brokers, rf):
        records.append(TopicRecord(name, tid))
        for i, replicas in enumerate(assignment):
            # The ISR its own tuple, as a decoded or decided record has it.
            isr = tuple(r for r in replicas)
            records.append(PartitionRecord(tid, i, replicas, isr, leader=replicas[0]))
    return records


def build_image(records: Sequence[Record]) -> MetadataImage:
    delta = MetadataDelta(EMPTY_IMAGE)
    for offset, record in enumerate(records):
        delta.replay(record, offset, EPOCH)
    return delta.apply()


def snapshot_of(image: MetadataImage) -> tuple[SnapshotId, bytes]:
    return SnapshotId(image.offset, image.epoch), encode_snapshot(image, image.offset)


def chunks(encoded: Sequence[bytes]) -> list[tuple[int, int]]:
    """[lo, hi) ranges of a write as QuorumController._append cuts it."""
    return batch_bounds(encoded, MAX_BATCH_RECORDS, MAX_BATCH_BYTES)


def led_by(image: MetadataImage, broker: int) -> int:
    return sum(1 for _, _, p in image.partitions() if p.leader == broker)


# -- the pure controller path -----------------------------------------------------

PHASES = ("decide", "encode", "speculative replay", "committed replay")


class LocalController:
    """The active controller's write path without a quorum: decide on the
    speculative image, encode, replay speculatively, then commit each batch
    through the state machine at once (the log is this process's counter)."""

    def __init__(self, sm: ControllerStateMachine | None = None, now_ms: int = 0) -> None:
        self.sm = sm or ControllerStateMachine()
        self.controller = Controller(ControllerOptions(CLUSTER_ID), random.Random(0))
        self.offset = self.sm.applied_offset
        self.phases = dict.fromkeys(PHASES, 0.0)
        # When a list: every record written is also appended to it.
        self.log: list[Record] | None = None
        self.append(self.controller.activate(self.sm.image, now_ms))

    def write(self, decide: Callable[[Controller], ControllerResult[T]]) -> ControllerResult[T]:
        c = self.controller
        c.next_offset = self.offset
        t0 = time.perf_counter()
        result = decide(c)
        self.phases["decide"] += time.perf_counter() - t0
        if result.records:
            self.append(result.records)
        return result

    def append(self, records: list[Record]) -> None:
        phases = self.phases
        t0 = time.perf_counter()
        encoded = [encode_record(r) for r in records]
        t1 = time.perf_counter()
        ranges = chunks(encoded)
        base = self.offset
        for lo, hi in ranges:
            self.controller.replay(records[lo:hi], base + lo, EPOCH)
        t2 = time.perf_counter()
        for lo, hi in ranges:
            self.sm.handle_commit(Batch(base + lo, EPOCH, tuple(encoded[lo:hi])))
        # Everything written has committed: QuorumController._on_batch takes
        # the committed image as the speculative one.
        self.controller.reset(self.sm.image)
        t3 = time.perf_counter()
        phases["encode"] += t1 - t0
        phases["speculative replay"] += t2 - t1
        phases["committed replay"] += t3 - t2
        self.offset += len(records)
        if self.log is not None:
            self.log.extend(records)

    def register_brokers(self, count: int) -> None:
        epochs = {}
        for b in range(count):
            request = RegisterRequest(b, CLUSTER_ID, incarnation(b), (endpoint(b),), None, FEATURES)
            epochs[b] = self.write(
                partial(Controller.register_broker, req=request, now_ms=0)
            ).response
        for b in range(count):
            beat = HeartbeatRequest(b, epochs[b], self.offset)
            self.write(partial(Controller.heartbeat, req=beat, now_ms=0))
        assert all(not r.fenced for r in self.sm.image.brokers.values())


def msgpack_round_trip(rows: Sequence[list[Any]]) -> float:
    """Seconds to pack and unpack each row on its own."""
    gc.collect()
    packb, unpackb = msgpack.packb, msgpack.unpackb
    start = time.perf_counter()
    for row in rows:
        unpackb(packb(row))
    return time.perf_counter() - start


def bench_topics(sizes: Sizes, repeat: int) -> list[dict[str, Any]]:
    """Many small topics, then one topic as large as one request may create."""
    return [
        topics_row(sizes, repeat, sizes.topics, sizes.partitions_per_topic),
        topics_row(sizes, repeat, 1, sizes.large_topic_partitions),
    ]


def topics_row(sizes: Sizes, repeat: int, topics: int, partitions: int) -> dict[str, Any]:
    ours_s, peer_s, phase_runs = [], [], []
    records = 0
    for _ in range(repeat):
        local = LocalController()
        local.register_brokers(sizes.brokers)
        local.phases = dict.fromkeys(PHASES, 0.0)
        written: list[Record] = []
        local.log = written
        gc.collect()
        start = time.perf_counter()
        for t in range(topics):
            topic = NewTopic(f"topic-{t:06d}", partitions, sizes.replication_factor)
            result = local.write(partial(Controller.create_topics, topics=[topic]))
            assert result.response[0].error is Errors.NONE, result.response[0]
        ours_s.append(time.perf_counter() - start)
        phase_runs.append(local.phases)
        records = len(written)
        assert local.sm.image.partition_count == topics * partitions
        # The peer: the same records' field lists, packed and unpacked.
        rows = [msgpack.unpackb(encode_record(r)) for r in written]
        peer_s.append(msgpack_round_trip(rows))
    seconds = statistics.median(ours_s)
    peer = statistics.median(peer_s)
    total = sum(sum(p.values()) for p in phase_runs)
    return {
        "topics": topics,
        "partitions": topics * partitions,
        "records": records,
        "seconds": round(seconds, 6),
        "topics_per_second": round(topics / seconds, 1),
        "partitions_per_second": round(topics * partitions / seconds),
        "peer_seconds": round(peer, 6),
        "ratio": round(statistics.median(o / p for o, p in zip(ours_s, peer_s, strict=True)), 2),
        "phase_share": {k: round(sum(p[k] for p in phase_runs) / total, 3) for k in PHASES},
    }


def fence_setup(partitions: int, sizes: Sizes) -> tuple[MetadataImage, SnapshotId, bytes]:
    records = image_records(
        partitions, sizes.fence_topic_size, sizes.brokers, sizes.replication_factor
    )
    image = build_image(records).with_provenance(len(records), EPOCH)
    sid, data = snapshot_of(image)
    return image, sid, data


def fence_once(
    sid: SnapshotId, data: bytes, victim: int, session_ms: int, profile: cProfile.Profile | None
) -> tuple[float, dict[str, float], list[Record], MetadataImage, MetadataImage]:
    """Load the image, let ``victim``'s session expire, fence it: seconds
    from the decision to the commit of its last record."""
    sm = ControllerStateMachine()
    sm.handle_load_snapshot(sid, data)
    local = LocalController(sm, now_ms=0)
    before = local.sm.image
    for b in before.brokers:
        if b != victim:
            local.controller.heartbeats.touch(b, session_ms)
    local.phases = dict.fromkeys(PHASES, 0.0)
    gc.collect()
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    result = local.write(lambda c: c.fence_expired(session_ms + 1))
    seconds = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    assert result.response == [victim], result.response
    after = local.sm.image
    return seconds, local.phases, result.records, before, after


def replay_alone(image: MetadataImage, records: Sequence[Record]) -> float:
    """Seconds to replay ``records`` into one delta of ``image`` and apply it."""
    gc.collect()
    start = time.perf_counter()
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, image.offset):
        delta.replay(record, offset, EPOCH)
    delta.apply()
    return time.perf_counter() - start


def bench_fence(
    sizes: Sizes, repeat: int, profile: cProfile.Profile | None = None
) -> dict[str, Any]:
    image, sid, data = fence_setup(sizes.fence_partitions, sizes)
    victim = 0
    led = led_by(image, victim)
    ours_s, peer_s, phase_runs = [], [], []
    records: list[Record] = []
    for _ in range(repeat):
        seconds, phases, records, before, after = fence_once(sid, data, victim, 9_000, profile)
        assert led_by(after, victim) == 0 and after.brokers[victim].fenced
        changes = [r for r in records if isinstance(r, PartitionChangeRecord)]
        ours_s.append(seconds)
        phase_runs.append(phases)
        peer_s.append(replay_alone(before, changes))
    seconds = statistics.median(ours_s)
    total = sum(sum(p.values()) for p in phase_runs)
    return {
        "partitions": sizes.fence_partitions,
        "led_by_fenced_broker": led,
        "records": len(records),
        "batches": len(chunks([encode_record(r) for r in records])),
        "decide_seconds": round(statistics.median(p["decide"] for p in phase_runs), 6),
        "seconds": round(seconds, 6),
        "re_led_per_second": round(led / seconds),
        "peer_seconds": round(statistics.median(peer_s), 6),
        "ratio": round(statistics.median(o / p for o, p in zip(ours_s, peer_s, strict=True)), 2),
        "phase_share": {k: round(sum(p[k] for p in phase_runs) / total, 3) for k in PHASES},
    }


# -- memory and snapshots -----------------------------------------------------------


def traced_growth(build: Callable[[], object]) -> int:
    """Bytes still allocated (tracemalloc) after ``build()``, while its
    result is alive; whatever it allocated and dropped is not counted."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del kept
    return grown


def bench_memory(sizes: Sizes) -> list[dict[str, Any]]:
    rows = []
    for partitions in sizes.memory_partitions:

        def image(partitions: int = partitions) -> object:
            return build_image(
                image_records(
                    partitions, sizes.fence_topic_size, sizes.brokers, sizes.replication_factor
                )
            )

        def tuples(partitions: int = partitions) -> object:
            # (topic id, partition, replicas, isr, removing, adding, leader,
            # recovery state, leader epoch, partition epoch), with the topics'
            # names and ids in a list beside.
            names, out = [], []
            for name, tid, assignment in layout(
                partitions, sizes.fence_topic_size, sizes.brokers, sizes.replication_factor
            ):
                names.append((name, tid))
                for i, replicas in enumerate(assignment):
                    isr = tuple(r for r in replicas)
                    out.append((tid, i, replicas, isr, (), (), replicas[0], 0, 0, 0))
            return names, out

        ours = traced_growth(image)
        peer = traced_growth(tuples)
        rows.append(
            {
                "partitions": partitions,
                "image_bytes": ours,
                "bytes_per_partition": round(ours / partitions, 1),
                "peer_bytes_per_partition": round(peer / partitions, 1),
                "ratio": round(ours / peer, 2),
            }
        )
    return rows


def paused_gc(call: Callable[..., T], *args: Any) -> tuple[float, T]:
    """Seconds ``call(*args)`` takes with the cyclic collector paused, and its
    result.  Unpacking 100,000 lists that stay alive otherwise spends most
    of its time in the collector's passes over them, which would make the
    peer, not ours, the noisy figure."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        result = call(*args)
        return time.perf_counter() - start, result
    finally:
        gc.enable()


SNAPSHOT_WORK = [
    ("decoding records", "metadata/records.py", "decode_record"),
    ("replaying them", "metadata/delta.py", "replay"),
]


def bench_snapshot(sizes: Sizes, repeat: int, profile: bool = False) -> dict[str, Any]:
    records = image_records(
        sizes.fence_partitions, sizes.fence_topic_size, sizes.brokers, sizes.replication_factor
    )
    image = build_image(records).with_provenance(len(records), EPOCH)
    sid = SnapshotId(image.offset, image.epoch)
    # The peer's rows: the same records' fields as plain lists.
    rows = [msgpack.unpackb(encode_record(r)) for r in image.to_records()]
    write_s, load_s, pack_s, unpack_s = [], [], [], []
    data = b""
    for _ in range(repeat):
        seconds, data = paused_gc(encode_snapshot, image, image.offset)
        write_s.append(seconds)
        seconds, loaded = paused_gc(decode_snapshot, sid, data)
        load_s.append(seconds)
        assert loaded.partition_count == sizes.fence_partitions
        del loaded
        seconds, packed = paused_gc(msgpack.packb, rows)
        pack_s.append(seconds)
        seconds, _ = paused_gc(msgpack.unpackb, packed)
        unpack_s.append(seconds)
    shares = {}
    if profile:
        prof = cProfile.Profile()
        start = time.process_time()
        prof.enable()
        decode_snapshot(sid, data)
        prof.disable()
        shares = profile_shares(prof, time.process_time() - start, SNAPSHOT_WORK)
    return {
        **({"load_profile_shares": shares} if profile else {}),
        "partitions": sizes.fence_partitions,
        "records": len(rows),
        "mb": round(len(data) / 1e6, 2),
        "write_seconds": round(statistics.median(write_s), 6),
        "load_seconds": round(statistics.median(load_s), 6),
        "peer_pack_seconds": round(statistics.median(pack_s), 6),
        "peer_unpack_seconds": round(statistics.median(unpack_s), 6),
        "write_ratio": round(
            statistics.median(o / p for o, p in zip(write_s, pack_s, strict=True)), 1
        ),
        "load_ratio": round(
            statistics.median(o / p for o, p in zip(load_s, unpack_s, strict=True)), 1
        ),
    }


# -- a real quorum -------------------------------------------------------------------


class QuorumBench:
    """Three controller nodes on loopback in this process, and 10 brokers
    that register and heartbeat through a MetadataClient."""

    def __init__(self, root: Path, session_ms: int = 9_000, snapshots: bool = True) -> None:
        from metadata.active import ControllerSettings
        from quorum.driver.storage_format import format_storage

        self.root = root
        self.settings = ControllerSettings(
            broker_session_timeout_ms=session_ms,
            broker_heartbeat_interval_ms=min(2_000, session_ms // 4),
        )
        self.options = (
            NodeOptions()
            if snapshots
            else NodeOptions(snapshot_every_offsets=0, snapshot_every_bytes=0)
        )
        base = free_base_port(3)
        self.voters = {i + 1: f"127.0.0.1:{base + i}" for i in range(3)}
        for n in self.voters:
            format_storage(root / f"node-{n}", CLUSTER_ID, n, self.voters.keys())
        self.servers: dict[int, Any] = {}
        self.epochs: dict[int, int] = {}
        self.beating: dict[int, asyncio.Task[None]] = {}
        self.last_beat: dict[int, float] = {}
        self.client: Any = None

    async def start(self) -> None:
        from metadata.client import MetadataClient
        from quorum.driver.server import NodeConfig
        from server.controller import controller_server

        for n in self.voters:
            config = NodeConfig(
                n, CLUSTER_ID, self.voters, self.root / f"node-{n}", options=self.options
            )
            self.servers[n] = controller_server(config, self.settings)
            await self.servers[n].start()
        self.client = MetadataClient(list(self.voters.values()), timeout_s=30.0)
        await self.wait_for(lambda: self.active() is not None, 30.0)

    async def stop(self) -> None:
        for task in self.beating.values():
            task.cancel()
        for task in self.beating.values():
            with contextlib.suppress(BaseException):
                await task
        if self.client is not None:
            await self.client.close()
        for server in self.servers.values():
            await server.stop(resign=False)

    def plugin(self, n: int) -> Any:
        from server.controller import plugin_of

        return plugin_of(self.servers[n])

    def active(self) -> Any:
        for n in self.servers:
            controller = self.plugin(n).controller
            if controller.is_active:
                return controller
        return None

    @staticmethod
    async def wait_for(cond: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError("the quorum benchmark waited too long")
            await asyncio.sleep(0.01)

    async def register_brokers(self, count: int) -> None:
        from metadata.client import Endpoint as EndpointProto
        from metadata.client import SupportedFeature

        features = [SupportedFeature(f.name, f.min_level, f.max_level) for f in FEATURES]
        for b in range(count):
            response = await self.client.register_broker(
                b,
                cluster_id=CLUSTER_ID,
                incarnation_id=incarnation(b),
                endpoints=[EndpointProto("PLAINTEXT", "127.0.0.1", 9092 + b)],
                features=features,
            )
            self.epochs[b] = response.broker_epoch
        for b in range(count):
            self.beating[b] = asyncio.get_running_loop().create_task(self._heartbeats(b))

        await self.wait_for(self.all_unfenced, 30.0)

    def all_unfenced(self) -> bool:
        active = self.active()
        brokers = active.committed_image().brokers if active is not None else {}
        return len(brokers) == len(self.epochs) and all(not r.fenced for r in brokers.values())

    async def _heartbeats(self, broker: int) -> None:
        interval = self.settings.broker_heartbeat_interval_ms / 1000
        while True:
            active = self.active()
            offset = active.committed_image().offset if active is not None else 0
            sent = time.perf_counter()
            with contextlib.suppress(Exception):
                await self.client.broker_heartbeat(broker, self.epochs[broker], offset)
                self.last_beat[broker] = sent
            await asyncio.sleep(interval)

    async def stop_heartbeats(self, broker: int) -> None:
        task = self.beating.pop(broker)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


@dataclass(frozen=True)
class LoopResult:
    # calls completed inside the measured window, and its length
    in_window: int
    seconds: float
    # every call completed (warm-up included), and the process's CPU time
    # (all threads) over the whole loop
    calls: int
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.in_window / self.seconds

    @property
    def cpu_ms_per_call(self) -> float:
        return 1000 * self.cpu_seconds / max(1, self.calls)


async def closed_loop(
    callers: int, warmup_s: float, seconds: float, call: Callable[[int, int], Any]
) -> LoopResult:
    """``callers`` coroutines calling ``call(caller, n)`` back to back."""
    loop = asyncio.get_running_loop()
    begin = loop.time() + warmup_s
    end = begin + seconds
    done = [0, 0]

    async def caller(c: int) -> None:
        n = 0
        while loop.time() < end:
            await call(c, n)
            n += 1
            done[1] += 1
            now = loop.time()
            if begin <= now <= end:
                done[0] += 1

    cpu = time.process_time()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return LoopResult(done[0], seconds, done[1], time.process_time() - cpu)


# (label, file name ending, function name) of the metadata work in a topic
TOPIC_WORK = [
    ("committed replay (3 nodes)", "metadata/state_machine.py", "handle_commit"),
    ("decoding records (part of it)", "metadata/records.py", "decode_record"),
    ("decision", "metadata/controller.py", "create_topics"),
    ("encoding and speculative replay", "metadata/active.py", "_append"),
]


def profile_shares(
    prof: cProfile.Profile, total_s: float, wanted: Sequence[tuple[str, str, str]]
) -> dict[str, float]:
    """Each wanted function's cumulative time as a share of ``total_s``."""
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    shares = {}
    for label, suffix, name in wanted:
        cumulative = sum(
            v[3] for (f, _, fn), v in stats.items() if f.endswith(suffix) and fn == name
        )
        shares[label] = round(cumulative / total_s, 3)
    return shares


async def quorum_topics(sizes: Sizes, profile: bool = False) -> dict[str, Any]:
    from kvstore.client import KvClient
    from metadata.client import NewTopic as NewTopicProto

    root = Path(tempfile.mkdtemp(prefix="kq-bench-metadata-"))
    bench = QuorumBench(root)
    rows = []
    profile_result: dict[str, Any] = {}
    try:
        await bench.start()
        await bench.register_brokers(sizes.brokers)
        kv = KvClient(list(bench.voters.values()), timeout_s=30.0)
        value = b"x" * 100
        try:
            for callers in sizes.quorum_clients:

                async def create(c: int, n: int, callers: int = callers) -> None:
                    topic = NewTopicProto(
                        f"c{callers}-{c}-{n}", sizes.partitions_per_topic, sizes.replication_factor
                    )
                    response = await bench.client.create_topics([topic])
                    if response.topics[0].error != 0:
                        raise RuntimeError(f"CreateTopics failed: {response.topics[0]}")

                async def put(c: int, n: int, callers: int = callers) -> None:
                    await kv.put(f"c{callers}-{c}-{n}", value)

                topics = await closed_loop(
                    callers, sizes.quorum_warmup_s, sizes.quorum_seconds, create
                )
                puts = await closed_loop(callers, sizes.quorum_warmup_s, sizes.quorum_seconds, put)
                rows.append(
                    {
                        "callers": callers,
                        "topics_per_second": round(topics.rate, 1),
                        "partitions_per_second": round(topics.rate * sizes.partitions_per_topic),
                        "peer_puts_per_second": round(puts.rate, 1),
                        "ratio": round(puts.rate / topics.rate, 2) if topics.in_window else None,
                        "cpu_ms_per_topic": round(topics.cpu_ms_per_call, 3),
                        "peer_cpu_ms_per_put": round(puts.cpu_ms_per_call, 3),
                    }
                )
            if profile:
                # Where a topic's CPU goes, at the most callers: a further
                # loop under cProfile (its overhead included in the total).
                callers = sizes.quorum_clients[-1]

                async def profiled(c: int, n: int) -> None:
                    topic = NewTopicProto(
                        f"p-{c}-{n}", sizes.partitions_per_topic, sizes.replication_factor
                    )
                    await bench.client.create_topics([topic])

                prof = cProfile.Profile()
                prof.enable()
                looped = await closed_loop(callers, 0.0, sizes.quorum_seconds, profiled)
                prof.disable()
                shares = profile_shares(prof, looped.cpu_seconds, TOPIC_WORK)
                profile_result = {
                    "callers": callers,
                    "cpu_ms_per_topic_profiled": round(looped.cpu_ms_per_call, 3),
                    "shares": shares,
                }
            # One topic as large as one request may create; peer, first: one
            # PutMany of as many 100-byte values.  Then whether the quorum kept
            # its leader through the following seconds.
            n = sizes.large_topic_partitions
            items = [(f"large-{i}", value) for i in range(n + 1)]
            start = time.perf_counter()
            await kv.put_many(items, timeout_s=60.0)
            put_many_s = time.perf_counter() - start
            await asyncio.sleep(sizes.quorum_settle_s)
            epoch = bench.active().active_epoch
            start = time.perf_counter()
            topic = NewTopicProto("large", n, sizes.replication_factor)
            response = await bench.client.create_topics([topic], timeout_s=60.0)
            large_s = time.perf_counter() - start
            if response.topics[0].error != 0:
                raise RuntimeError(f"CreateTopics failed: {response.topics[0]}")
            await asyncio.sleep(sizes.quorum_settle_s)
            active = bench.active()
            large = {
                "partitions": n,
                "seconds": round(large_s, 6),
                "peer_put_many_seconds": round(put_many_s, 6),
                "ratio": round(large_s / put_many_s, 1),
                "leader_changed": active is None or active.active_epoch != epoch,
                "settle_s": sizes.quorum_settle_s,
            }
        finally:
            await kv.close()
    finally:
        await bench.stop()
        shutil.rmtree(root, ignore_errors=True)
    out = {"callers": rows, "large_topic": large}
    if profile:
        out["profile"] = profile_result
    return out


async def quorum_fence(sizes: Sizes) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kq-bench-metadata-"))
    session_ms = sizes.quorum_session_ms
    bench = QuorumBench(root, session_ms=session_ms, snapshots=False)
    partitions = sizes.quorum_fence_partitions
    victim = 0
    try:
        await bench.start()
        await bench.register_brokers(sizes.brokers)
        # Bulk-load the topics: their records proposed straight to the
        # leader's log, in batches (the controller takes the committed image
        # once they are applied).
        records = topic_records(
            partitions, sizes.fence_topic_size, sizes.brokers, sizes.replication_factor
        )
        encoded = [encode_record(r) for r in records]
        load_start = time.perf_counter()
        for lo, hi in chunks(encoded):
            # One batch at a time, so heartbeats get through in between.
            await bench.active().node.propose(encoded[lo:hi], 120.0)

        def loaded() -> bool:
            return all(
                bench.plugin(n).controller.committed_image().partition_count == partitions
                for n in bench.servers
            )

        await bench.wait_for(loaded, 120.0)
        load_seconds = time.perf_counter() - load_start
        # Settle: an active controller, every broker unfenced (a broker whose
        # heartbeats the load delayed past its session was fenced and is
        # unfenced by its next heartbeat), and fresh sessions all round.
        await bench.wait_for(lambda: bench.active() is not None, 30.0)
        await bench.wait_for(bench.all_unfenced, 30.0)
        await asyncio.sleep(2 * bench.settings.broker_heartbeat_interval_ms / 1000)
        active = bench.active()
        epoch = active.active_epoch
        before = active.committed_image()
        led = led_by(before, victim)

        # Note the decision: when fence_expired returns records, and what.
        decided: dict[str, Any] = {}
        controller = active.controller
        original = controller.fence_expired

        def fence_expired(now_ms: int, limit: int = 1) -> ControllerResult[list[int]]:
            start = time.perf_counter()
            result = original(now_ms, limit)
            if result.records and "at" not in decided:
                decided.update(
                    at=start,
                    decide_s=time.perf_counter() - start,
                    records=result.records,
                    fenced=result.response,
                    image=controller.image,
                )
            return result

        setattr(controller, "fence_expired", fence_expired)  # noqa: B010
        committed: dict[int, float] = {}

        def on_batch(n: int) -> Callable[[Batch], None]:
            sm = bench.plugin(n).controller.sm

            def check(batch: Batch) -> None:
                reg = sm.image.brokers.get(victim)
                if n not in committed and reg is not None and reg.fenced:
                    committed[n] = time.perf_counter()

            return check

        for n in bench.servers:
            bench.plugin(n).controller.sm.add_batch_listener(on_batch(n))
        await bench.stop_heartbeats(victim)
        expiry = bench.last_beat[victim] + session_ms / 1000
        await bench.wait_for(lambda: len(committed) == len(bench.servers), 60.0 + session_ms / 1000)
        if decided.get("fenced") != [victim]:
            raise RuntimeError(f"the controller fenced {decided.get('fenced')}, not {victim}")
        if active.active_epoch != epoch:
            raise RuntimeError("the active controller changed during the measurement")
        leader_n = next(n for n in bench.servers if bench.plugin(n).controller is active)
        for n in bench.servers:
            image = bench.plugin(n).controller.committed_image()
            assert led_by(image, victim) == 0, f"node {n} still has partitions led by {victim}"
        others_fenced = [
            b for b, r in active.committed_image().brokers.items() if r.fenced and b != victim
        ]
        to_leader = committed[leader_n] - decided["at"]
        to_all = max(committed.values()) - decided["at"]
        changes = [r for r in decided["records"] if isinstance(r, PartitionChangeRecord)]
        peer = statistics.median(replay_alone(before, changes) for _ in range(3))
        return {
            "partitions": partitions,
            "load_seconds": round(load_seconds, 2),
            "led_by_fenced_broker": led,
            "records": len(decided["records"]),
            "expiry_to_decision_s": round(decided["at"] - expiry, 3),
            "decide_seconds": round(decided["decide_s"], 6),
            "seconds_to_leader_commit": round(to_leader, 6),
            "seconds_to_all_nodes": round(to_all, 6),
            "re_led_per_second": round(led / to_leader),
            "peer_seconds": round(peer, 6),
            "ratio": round(to_leader / peer, 2),
            "other_brokers_fenced": others_fenced,
        }
    finally:
        await bench.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- running and reporting -------------------------------------------------------------


def run(
    sections: Sequence[str], sizes: Sizes, repeat: int, profile: bool = False
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for section in sections:
        start = time.perf_counter()
        if section == "topics":
            results[section] = bench_topics(sizes, repeat)
        elif section == "fence":
            prof = cProfile.Profile() if profile else None
            results[section] = bench_fence(sizes, repeat, prof)
            if prof is not None:
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
                results["fence_profile"] = _strip_paths(out.getvalue())
        elif section == "memory":
            results[section] = bench_memory(sizes)
        elif section == "snapshot":
            results[section] = bench_snapshot(sizes, repeat, profile)
        elif section in ("quorum", "fence-quorum"):
            bench = quorum_topics(sizes, profile) if section == "quorum" else quorum_fence(sizes)
            results[section] = asyncio.run(bench)
        else:
            raise ValueError(f"unknown section {section!r}")
        results.setdefault("section_seconds", {})[section] = round(time.perf_counter() - start, 1)
    return results


def _strip_paths(text: str) -> str:
    """A profile's file names relative to the repository or the library."""
    for prefix in (str(ROOT) + "/", sysconfig.get_paths()["stdlib"] + "/"):
        text = text.replace(prefix, "")
    return text


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _shares(shares: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in shares.items())


def report(results: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    if "topics" in results:
        add("### topics: pure controller path, one CreateTopics request per topic\n")
        add(
            "| topics | partitions | records | seconds | topics/s | partitions/s | "
            "peer msgpack s | ratio |"
        )
        add("|---|---|---|---|---|---|---|---|")
        for r in results["topics"]:
            add(
                f"| {r['topics']:,} | {r['partitions']:,} | {r['records']:,} | "
                f"{r['seconds']:.3f} | {_rate(r['topics_per_second'])} | "
                f"{r['partitions_per_second']:,} | {r['peer_seconds']:.3f} | {r['ratio']:.1f} |"
            )
        add("")
        for r in results["topics"]:
            add(
                f"time ({r['topics']:,} x {r['partitions'] // r['topics']:,}): "
                f"{_shares(r['phase_share'])}"
            )
        add("")
    if "quorum" in results:
        r = results["quorum"]
        add("### quorum: CreateTopics through a 3-node in-process quorum\n")
        if "skipped" in r:
            add(f"skipped: {r['skipped']}\n")
        else:
            add("| callers | topics/s | partitions/s | peer KV puts/s | ratio |")
            add("|---|---|---|---|---|")
            for row in r["callers"]:
                add(
                    f"| {row['callers']} | {_rate(row['topics_per_second'])} | "
                    f"{row['partitions_per_second']:,} | {_rate(row['peer_puts_per_second'])} | "
                    f"{row['ratio']} |"
                )
            add(
                "\nprocess CPU per call (all threads, ms): "
                + ", ".join(
                    f"{row['callers']} callers: topic {row['cpu_ms_per_topic']}, "
                    f"put {row['peer_cpu_ms_per_put']}"
                    for row in r["callers"]
                )
            )
            if "profile" in r:
                p = r["profile"]
                add(
                    f"\ncProfile, {p['callers']} callers: {p['cpu_ms_per_topic_profiled']} ms "
                    f"of CPU per topic (profiled); {_shares(p['shares'])}"
                )
            large = r["large_topic"]
            add(
                f"\none topic of {large['partitions']:,} partitions: {large['seconds']:.3f} s; "
                f"peer, one PutMany of {large['partitions'] + 1:,} values: "
                f"{large['peer_put_many_seconds']:.3f} s; ratio {large['ratio']}; "
                f"active controller changed within {large['settle_s']:g} s after: "
                f"{'yes' if large['leader_changed'] else 'no'}\n"
            )
    if "fence" in results:
        r = results["fence"]
        add("### fence: one broker's session expires, pure controller path\n")
        add(
            "| partitions | led by it | records | batches | decide s | seconds | re-led/s | "
            "peer replay s | ratio |"
        )
        add("|---|---|---|---|---|---|---|---|---|")
        add(
            f"| {r['partitions']:,} | {r['led_by_fenced_broker']:,} | {r['records']:,} | "
            f"{r['batches']} | {r['decide_seconds']:.3f} | {r['seconds']:.3f} | "
            f"{r['re_led_per_second']:,} | "
            f"{r['peer_seconds']:.3f} | {r['ratio']:.1f} |"
        )
        add(f"\ntime: {_shares(r['phase_share'])}\n")
    if "fence-quorum" in results:
        r = results["fence-quorum"]
        add("### fence-quorum: the same on a 3-node in-process quorum\n")
        if "skipped" in r:
            add(f"skipped: {r['skipped']}\n")
        else:
            add(
                "| partitions | led by it | records | decide s | to leader commit s | "
                "to all nodes s | re-led/s | peer replay s | ratio |"
            )
            add("|---|---|---|---|---|---|---|---|---|")
            add(
                f"| {r['partitions']:,} | {r['led_by_fenced_broker']:,} | {r['records']:,} | "
                f"{r['decide_seconds']:.3f} | {r['seconds_to_leader_commit']:.3f} | "
                f"{r['seconds_to_all_nodes']:.3f} | {r['re_led_per_second']:,} | "
                f"{r['peer_seconds']:.3f} | {r['ratio']:.1f} |"
            )
            add(
                f"\nbulk load {r['load_seconds']} s; session expiry to decision "
                f"{r['expiry_to_decision_s']} s; other brokers fenced: "
                f"{r['other_brokers_fenced'] or 'none'}\n"
            )
    if "memory" in results:
        add("### memory: tracemalloc growth building the image\n")
        add("| partitions | image MB | bytes/partition | peer tuples bytes/partition | ratio |")
        add("|---|---|---|---|---|")
        for row in results["memory"]:
            add(
                f"| {row['partitions']:,} | {row['image_bytes'] / 1e6:.1f} | "
                f"{row['bytes_per_partition']:,} | {row['peer_bytes_per_partition']:,} | "
                f"{row['ratio']:.2f} |"
            )
        add("")
    if "snapshot" in results:
        r = results["snapshot"]
        add("### snapshot: encode_snapshot / decode_snapshot\n")
        add(
            "| partitions | records | MB | write s | load s | peer pack s | peer unpack s | "
            "write ratio | load ratio |"
        )
        add("|---|---|---|---|---|---|---|---|---|")
        add(
            f"| {r['partitions']:,} | {r['records']:,} | {r['mb']} | {r['write_seconds']:.3f} | "
            f"{r['load_seconds']:.3f} | {r['peer_pack_seconds']:.3f} | "
            f"{r['peer_unpack_seconds']:.3f} | {r['write_ratio']} | {r['load_ratio']} |"
        )
        if "load_profile_shares" in r:
            add(f"\ncProfile of one load: {_shares(r['load_profile_shares'])}")
        add("")
    if "fence_profile" in results:
        add("### cProfile of the fence (by own time; this run's figures include its overhead)\n")
        add("```\n" + results["fence_profile"].strip() + "\n```")
    return "\n".join(lines)


def with_overrides(sizes: Sizes, overrides: Sequence[str]) -> Sizes:
    """``sizes`` with ``name=value`` overrides (a tuple: comma-separated)."""
    changes: dict[str, Any] = {}
    for item in overrides:
        name, _, text = item.partition("=")
        if not hasattr(sizes, name) or not text:
            raise ValueError(f"--size {item!r}: give NAME=VALUE with NAME a field of Sizes")
        current = getattr(sizes, name)
        try:
            if isinstance(current, tuple):
                changes[name] = tuple(int(x) for x in text.split(","))
            else:
                changes[name] = type(current)(text)
        except ValueError:
            raise ValueError(
                f"--size {item!r}: {text!r} is not a {type(current).__name__}"
            ) from None
    return dataclasses.replace(sizes, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "sections",
        nargs="*",
        metavar="SECTION",
        help=f"any of {', '.join(SECTIONS)} (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each pure figure (median)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the fence, a snapshot load and (at the most callers) quorum topics",
    )
    parser.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override one of the sizes (fields of Sizes), e.g. large_topic_partitions=5000",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    sizes = QUICK if args.quick else FULL
    try:
        sizes = with_overrides(sizes, args.size)
    except ValueError as exc:
        parser.error(str(exc))
    results = run(args.sections or SECTIONS, sizes, args.repeat, args.profile)
    if args.json:
        results.pop("fence_profile", None)
        print(json.dumps({"sizes": dataclasses.asdict(sizes), **results}, indent=2))
    else:
        print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Load processes of the brokers' benchmark (``bench/brokers.py``): each
runs one client of kq's gRPC library on its own core's worth of Python and
prints one JSON line with what it measured.

* ``produce``: one batching producer (acks=all, idempotent) sending records
  of ``--size`` bytes with null keys (the sticky partitioner spreads them
  over the topic's partitions) as fast as it can from ``--start`` (a
  ``time.monotonic()`` instant, which is the system's CLOCK_MONOTONIC on
  Linux, so every process's window is the same) for ``--warmup`` +
  ``--duration`` seconds; it prints ``ready`` once it has the topic's
  metadata and reads that instant from its stdin; it counts the records whose acknowledgement
  arrived inside the measurement window.
* ``consume``: one consumer of every partition of ``--topic``, from the end
  of each; it prints ``ready`` once it has its positions, then reads until
  it has ``--expect`` records or ``--until`` passes. Each record's value
  starts with the instant (``time.monotonic()``, a little-endian double) its
  send was *scheduled* by the open-loop producer, so the latency is from
  the scheduled send to the record's arrival here (OpenMessaging
  Benchmark's end-to-end latency, without coordinated omission).
* ``member``: one member of consumer group ``--group`` subscribed to
  ``--topic`` (auto-commit off, for the groups' benchmark,
  ``bench/groups.py``); it polls and prints ``{"assigned": [partition,
  ...]}`` each time its assignment changes, until its stdin closes (then it
  leaves the group) or it is killed (then its session expires).

All find the cluster's brokers and the admin's certificate in the local
cluster's folder (``--cluster-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import make_value, percentile
from broker.client.consumer import ConsumerConfig, OffsetResetStrategy
from broker.client.producer_batch import Acks, ProducerConfig, TopicPartition
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.producer import Producer
from server.local_cluster import load_state

STAMP = struct.Struct("<d")


def stamped_value(scheduled: float, size: int, filler: bytes) -> bytes:
    """A record value of ``size`` bytes (at least 8) starting with the
    scheduled send instant."""
    if size < STAMP.size:
        raise ValueError(f"a stamped value needs at least {STAMP.size} bytes, not {size}")
    return STAMP.pack(scheduled) + filler[: size - STAMP.size]


def scheduled_of(value: bytes) -> float:
    return float(STAMP.unpack_from(value)[0])


def _cluster(directory: str) -> tuple[list[str], Any]:
    state = load_state(directory)
    if state is None:
        raise SystemExit(f"no local cluster in {directory}")
    return state.broker_addresses(), state.client_credentials()


def producer_config(args: argparse.Namespace) -> ProducerConfig:
    return ProducerConfig(
        acks=Acks.ALL,
        enable_idempotence=True,
        linger_ms=args.linger_ms,
        batch_size=args.batch_size,
        buffer_memory=args.buffer_memory,
        delivery_timeout_ms=120_000,
    )


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    brokers, credentials = _cluster(args.cluster_dir)
    value = make_value(args.size)
    t_measure = t_end = float("inf")
    counts = {"acked": 0, "failed": 0, "sent": 0}
    last_error: list[str] = []

    def settled(future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            counts["failed"] += 1
            if future.done() and not future.cancelled() and not last_error:
                last_error.append(repr(future.exception())[:300])
            return
        if t_measure <= time.monotonic() <= t_end:
            counts["acked"] += 1

    producer = Producer(brokers, producer_config(args), credentials=credentials)
    try:
        await producer.metadata.partition_count(args.topic, 10_000)
        print("ready", flush=True)
        start = float(await asyncio.to_thread(sys.stdin.readline))
        t_measure = start + args.warmup
        t_end = t_measure + args.duration
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        while time.monotonic() < t_end:
            for _ in range(100):
                future = await producer.send(args.topic, value)
                future.add_done_callback(settled)
            counts["sent"] += 100
            # Let the sender run between bursts, as a user's loop would.
            await asyncio.sleep(0)
    finally:
        await producer.close(timeout_s=10)
    return {
        "records": counts["acked"],
        "seconds": args.duration,
        "sent": counts["sent"],
        "failed": counts["failed"],
        "last_error": last_error[0] if last_error else None,
    }


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    brokers, credentials = _cluster(args.cluster_dir)
    config = ConsumerConfig(
        auto_offset_reset=OffsetResetStrategy.LATEST, fetch_max_wait_ms=args.fetch_max_wait_ms
    )
    latencies: list[float] = []
    seen: set[tuple[int, int]] = set()
    duplicates = 0
    async with Consumer(brokers, config, credentials=credentials) as consumer:
        partitions = await consumer.metadata.partition_count(args.topic, 10_000)
        tps = [TopicPartition(args.topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_end()
        for tp in tps:
            await consumer.position(tp)
        print("ready", flush=True)
        while len(latencies) < args.expect and time.monotonic() < args.until:
            left_ms = int(max(1.0, (args.until - time.monotonic()) * 1000))
            for record in await consumer.poll(timeout_ms=min(500, left_ms)):
                arrived = time.monotonic()
                where = (record.partition, record.offset)
                if where in seen:
                    duplicates += 1
                    continue
                seen.add(where)
                assert record.value is not None
                latencies.append(arrived - scheduled_of(record.value))
    summary: dict[str, Any] = {"records": len(latencies), "duplicates": duplicates}
    if latencies:
        summary.update(
            {
                "p50_ms": percentile(latencies, 50) * 1e3,
                "p99_ms": percentile(latencies, 99) * 1e3,
                "p999_ms": percentile(latencies, 99.9) * 1e3,
                "max_ms": max(latencies) * 1e3,
            }
        )
    return summary


async def member(args: argparse.Namespace) -> dict[str, Any]:
    brokers, credentials = _cluster(args.cluster_dir)
    consumer = Consumer(brokers, credentials=credentials, group_id=args.group,
                        enable_auto_commit=False)  # fmt: skip
    consumer.subscribe([args.topic])
    closed = asyncio.ensure_future(asyncio.to_thread(sys.stdin.readline))
    shown: list[int] | None = None
    try:
        while not closed.done():
            await consumer.poll(timeout_ms=100)
            owned = sorted(tp.partition for tp in consumer.assignment() if tp.topic == args.topic)
            if owned != shown:
                print(json.dumps({"assigned": owned}), flush=True)
                shown = owned
    finally:
        await consumer.close(timeout_ms=10_000)
    return {"left": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--cluster-dir", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--warmup", type=float, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16_384)
    p.add_argument("--buffer-memory", type=int, default=32 * 1024 * 1024)
    c = sub.add_parser("consume")
    c.add_argument("--cluster-dir", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--expect", type=int, required=True)
    c.add_argument("--until", type=float, required=True)
    c.add_argument("--fetch-max-wait-ms", type=int, default=500)
    m = sub.add_parser("member")
    m.add_argument("--cluster-dir", required=True)
    m.add_argument("--group", required=True)
    m.add_argument("--topic", required=True)
    args = parser.parse_args(argv)
    run = {"produce": produce, "consume": consume, "member": member}[args.what]
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

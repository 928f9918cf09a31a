"""The transactions' benchmark: transactions per second and commit latency
beside the same records produced idempotently, and the cost of
``read_committed`` for a consumer, on a local cluster of 3 controllers and
3 brokers (``kq cluster up``, mutual TLS, the admin's certificate; the
cluster, the presets' shape, the arguments and the output are
``bench/brokers.py``'s), driven by kq's gRPC client library. Every topic has
replication factor 3 and ``min.insync.replicas`` 2; the values are 100
bytes, without keys; every producer is idempotent with acks=all and Kafka's
``linger.ms`` of 5.

* ``txn``: for each shape (records per transaction and the partitions they
  are spread over, record ``i`` to partition ``i mod partitions`` of one
  topic), one transactional producer runs sequential transactions (begin,
  send the records, ``commit_transaction``). Measured: transactions per
  second (the transactions' count over the sum of their times), the commit
  (the ``commit_transaction`` call: the records sent at once and
  acknowledged, then EndTxn), its EndTxn part (from the last record's
  acknowledgement to the call's return), the whole transaction (begin to
  the commit's return), the first record's acknowledgement from the begin
  (after the AddPartitionsToTxn, retried while the previous transaction's
  markers are written, and the leader's check with the coordinator) and
  the requests sent to the coordinator per transaction (2 without a retry:
  AddPartitionsToTxn and EndTxn). Peer, in the same run and taking
  turns with it a slice at a time (every shape and both series in each
  slice, so all see the same load): an idempotent producer sending the same
  records to the same partitions and flushing each group of them, measured
  the same way (groups per second; the flush; the whole group).
* ``read``: a topic of ``read_partitions`` partitions filled beforehand by
  ``fill_producers`` transactional producers at once, each transaction of
  ``fill_records`` records spread over the partitions, one transaction in
  ten aborted once its records were acknowledged (so the log holds aborted
  batches for a ``read_committed`` reader to drop). A consumer (assigned
  every partition) reads the topic from its start to its end, at
  ``read_committed`` and at ``read_uncommitted`` in turn (each first in
  every other trial), ``read_trials`` times each: the seconds from the
  positions known to every partition's end reached, and the records
  returned (the committed ones only at ``read_committed``; all, the aborted
  ones too, at ``read_uncommitted``).

```sh
.venv/bin/python bench/transactions.py --preset full [--only txn,read] [--json]
.venv/bin/python bench/transactions.py --preset small   # about 20 s
```
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import brokers as bench
from bench.brokers import Cluster, _ms, fully_replicated, now
from bench.harness import latency_summary, make_value, percentile
from broker.client.consumer import ConsumerConfig, IsolationLevel
from broker.client.producer_batch import ProducerConfig, TopicPartition
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.producer import Producer, RecordMetadata

SECTIONS = ("txn", "read")
VALUE_BYTES = 100
# One transaction in this many is aborted in the read section's topic.
ABORT_EVERY = 10
# Every producer's settings: Kafka's defaults (idempotent, acks=all,
# linger.ms 5), with answers awaited no longer than a benchmark can wait.
PRODUCER_CONFIG = ProducerConfig(request_timeout_ms=10_000, delivery_timeout_ms=30_000)
# A transaction (or a flushed group) not done in this long counts as failed.
CALL_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Preset:
    # (records per transaction, partitions they are spread over)
    shapes: tuple[tuple[int, int], ...]
    transactions: int  # per shape and series
    slices: int  # the series take turns this many times
    warmup: int  # transactions (and groups) per shape and series before
    read_partitions: int
    fill_producers: int  # transactional producers filling the topic at once
    fill_transactions: int  # in all
    fill_records: int  # per transaction
    read_trials: int  # reads at each isolation level
    # The controllers' broker.session.timeout.ms (no broker is killed here).
    session_timeout_ms: int


PRESETS = {
    "small": Preset(
        shapes=((1, 1), (10, 10)),
        transactions=20,
        slices=2,
        warmup=2,
        read_partitions=3,
        fill_producers=2,
        fill_transactions=40,
        fill_records=10,
        read_trials=2,
        session_timeout_ms=9_000,
    ),
    "full": Preset(
        # A transaction of one record touches one partition: no (1, 10).
        shapes=((1, 1), (10, 1), (10, 10), (100, 1), (100, 10)),
        transactions=300,
        slices=10,
        warmup=5,
        read_partitions=3,
        fill_producers=4,
        fill_transactions=1_000,
        fill_records=100,
        read_trials=8,
        session_timeout_ms=9_000,
    ),
}


def shape_name(records: int, partitions: int) -> str:
    return f"{records}r-{partitions}p"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _per_s(count: int, seconds: Sequence[float]) -> float | None:
    total = sum(seconds)
    return count / total if total > 0 else None


# --------------------------------------------------------------------------
# Transactions beside idempotent groups of the same records


@dataclass
class Series:
    """One series' times (seconds) for one shape."""

    done: int = 0
    errors: int = 0
    records_acked: int = 0
    # Requests to the transaction coordinator (AddPartitionsToTxn, EndTxn
    # and their retries), over the transactions done.
    coordinator_requests: int = 0
    whole: list[float] | None = None
    commit: list[float] | None = None  # commit_transaction, or the flush
    first_ack: list[float] | None = None  # the start to the first record's ack
    end_txn: list[float] | None = None  # the last ack to the commit's return

    def __post_init__(self) -> None:
        self.whole, self.commit, self.first_ack, self.end_txn = [], [], [], []


class Timed:
    """The futures of a group of sends and the instant the last of them
    resolved (seen by a done callback, in the event loop)."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[RecordMetadata]] = []
        self.first_done: float | None = None
        self.last_done = 0.0

    def add(self, future: asyncio.Future[RecordMetadata]) -> None:
        self.futures.append(future)
        future.add_done_callback(self._done)

    def _done(self, _: asyncio.Future[RecordMetadata]) -> None:
        self.last_done = time.perf_counter()
        if self.first_done is None:
            self.first_done = self.last_done

    def acked(self) -> int:
        return sum(1 for f in self.futures if f.done() and f.exception() is None)


async def send_group(
    producer: Producer, topic: str, records: int, partitions: int, value: bytes
) -> Timed:
    timed = Timed()
    for i in range(records):
        timed.add(await producer.send(topic, value, partition=i % partitions))
    return timed


async def one_transaction(
    producer: Producer, topic: str, records: int, partitions: int, value: bytes, got: Series
) -> None:
    """A transaction of ``records`` records, committed; its times in ``got``
    (an error counted there, and the transaction aborted)."""
    requests = coordinator_requests(producer)
    t0 = time.perf_counter()
    producer.begin_transaction()
    timed: Timed | None = None
    try:
        timed = await send_group(producer, topic, records, partitions, value)
        t_sent = time.perf_counter()
        await producer.commit_transaction(CALL_TIMEOUT_MS)
        t_end = time.perf_counter()
    except Exception:
        got.errors += 1
        await producer.abort_transaction(CALL_TIMEOUT_MS)
        return
    acked = timed.acked()
    got.records_acked += acked
    if acked != records:
        got.errors += 1
        return
    assert got.whole is not None and got.commit is not None and got.end_txn is not None
    assert got.first_ack is not None and timed.first_done is not None
    got.done += 1
    got.coordinator_requests += coordinator_requests(producer) - requests
    got.whole.append(t_end - t0)
    got.commit.append(t_end - t_sent)
    got.first_ack.append(timed.first_done - t0)
    got.end_txn.append(t_end - timed.last_done)


async def one_group(
    producer: Producer, topic: str, records: int, partitions: int, value: bytes, got: Series
) -> None:
    """The same records sent idempotently and flushed; its times in ``got``."""
    t0 = time.perf_counter()
    try:
        timed = await send_group(producer, topic, records, partitions, value)
        t_sent = time.perf_counter()
        await producer.flush(CALL_TIMEOUT_MS / 1000)
        t_end = time.perf_counter()
    except Exception:
        got.errors += 1
        return
    acked = timed.acked()
    got.records_acked += acked
    if acked != records:
        got.errors += 1
        return
    assert got.whole is not None and got.commit is not None
    assert got.first_ack is not None and timed.first_done is not None
    got.done += 1
    got.whole.append(t_end - t0)
    got.commit.append(t_end - t_sent)
    got.first_ack.append(timed.first_done - t0)


def coordinator_requests(producer: Producer) -> int:
    """The requests a transactional producer sent its coordinator so far."""
    coordinator = producer._coordinator
    return 0 if coordinator is None else coordinator.requests


def series_figures(got: Series, records: int) -> dict[str, Any]:
    assert got.whole is not None and got.commit is not None and got.end_txn is not None
    assert got.first_ack is not None
    per_s = _per_s(got.done, got.whole)
    out: dict[str, Any] = {
        "done": got.done,
        "errors": got.errors,
        "records_acked": got.records_acked,
        "per_s": per_s,
        "records_per_s": None if per_s is None else per_s * records,
        "whole": latency_summary(got.whole),
        "commit": latency_summary(got.commit),
        "first_ack": latency_summary(got.first_ack),
    }
    if got.end_txn:
        out["end_txn"] = latency_summary(got.end_txn)
        out["coordinator_requests_per_txn"] = got.coordinator_requests / max(1, got.done)
    return out


async def end_offsets(
    cluster: Cluster, tps: Sequence[TopicPartition], isolation: IsolationLevel
) -> dict[TopicPartition, int]:
    """Each partition's end (the high watermark, or the last stable offset
    at ``read_committed``), by ListOffsets."""
    config = ConsumerConfig(isolation_level=isolation)
    async with Consumer(cluster.brokers, config, credentials=cluster.credentials()) as consumer:
        consumer.assign(tps)
        consumer.seek_to_end(tps)
        return {tp: await consumer.position(tp) for tp in tps}


async def settled_ends(
    cluster: Cluster, tps: Sequence[TopicPartition], timeout_s: float
) -> dict[TopicPartition, int]:
    """The partitions' ends once every transaction's markers are written
    (the last stable offset has reached the high watermark)."""
    deadline = now() + timeout_s
    while True:
        high = await end_offsets(cluster, tps, IsolationLevel.READ_UNCOMMITTED)
        stable = await end_offsets(cluster, tps, IsolationLevel.READ_COMMITTED)
        if stable == high:
            return high
        if now() > deadline:
            raise RuntimeError(f"the last stable offsets {stable} stayed below {high}")
        await asyncio.sleep(0.1)


async def txn(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic = "bench-txn"
    partitions = max(p for _, p in preset.shapes)
    await cluster.create_topic(topic, partitions)
    await cluster.wait_topics([topic], 60, fully_replicated)
    value = make_value(VALUE_BYTES)
    credentials = cluster.credentials()
    transactional = Producer(
        cluster.brokers,
        PRODUCER_CONFIG,
        credentials=credentials,
        transactional_id="bench-txn",
        transaction_timeout_ms=60_000,
    )
    idempotent = Producer(cluster.brokers, PRODUCER_CONFIG, credentials=credentials)
    runs = {"txn": one_transaction, "idempotent": one_group}
    producers = {"txn": transactional, "idempotent": idempotent}
    got = {(shape, s): Series() for shape in preset.shapes for s in runs}
    sent_records = 0  # every record sent, the warm-up's too
    markers = 0  # one per partition per committed transaction
    try:
        await transactional.init_transactions(CALL_TIMEOUT_MS)
        for records, spread in preset.shapes:  # warm-up: channels, ids, leaders
            for series, run_one in runs.items():
                warm = Series()
                for _ in range(preset.warmup):
                    await run_one(producers[series], topic, records, spread, value, warm)
                if warm.errors:
                    raise RuntimeError(f"{series} failed {warm.errors} warm-up rounds")
                sent_records += warm.records_acked
                if series == "txn":
                    markers += warm.done * min(records, spread)
        per_slice = max(1, preset.transactions // preset.slices)
        for _ in range(preset.slices):
            for shape in preset.shapes:
                records, spread = shape
                for series, run_one in runs.items():
                    for _ in range(per_slice):
                        await run_one(producers[series], topic, records, spread, value,
                                      got[shape, series])  # fmt: skip
        for (shape, series), g in got.items():
            sent_records += g.records_acked
            if series == "txn":
                markers += g.done * min(shape)
    finally:
        await transactional.close(timeout_s=10)
        await idempotent.close(timeout_s=10)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = await settled_ends(cluster, tps, 60)
    shapes: dict[str, Any] = {}
    for records, spread in preset.shapes:
        t = series_figures(got[(records, spread), "txn"], records)
        i = series_figures(got[(records, spread), "idempotent"], records)
        shapes[shape_name(records, spread)] = {
            "records": records,
            "partitions": spread,
            "txn": t,
            "idempotent": i,
            "ratio_per_s": _ratio(t["per_s"], i["per_s"]),
            "ratio_commit_p50": _ratio(t["commit"]["p50_ms"], i["commit"]["p50_ms"]),
            "ratio_commit_p99": _ratio(t["commit"]["p99_ms"], i["commit"]["p99_ms"]),
            "ratio_whole_p50": _ratio(t["whole"]["p50_ms"], i["whole"]["p50_ms"]),
            "ratio_whole_p99": _ratio(t["whole"]["p99_ms"], i["whole"]["p99_ms"]),
        }
    return {
        "value_bytes": VALUE_BYTES,
        "linger_ms": PRODUCER_CONFIG.linger_ms,
        "per_shape": max(1, preset.transactions // preset.slices) * preset.slices,
        "shapes": shapes,
        # The log holds every record sent and one marker per partition per
        # committed transaction, nothing else.
        "log_offsets": sum(ends.values()),
        "expected_log_offsets": sent_records + markers,
    }


# --------------------------------------------------------------------------
# read_committed against read_uncommitted


async def fill(cluster: Cluster, preset: Preset, topic: str) -> dict[str, int]:
    """``fill_transactions`` transactions by ``fill_producers`` producers at
    once; every ``ABORT_EVERY``-th of each producer aborted once its records
    were acknowledged. The records committed and aborted."""
    value = make_value(VALUE_BYTES)
    counts = {"committed": 0, "aborted": 0, "transactions": 0, "aborted_transactions": 0}

    async def producer_loop(n: int, share: int) -> None:
        producer = Producer(
            cluster.brokers,
            PRODUCER_CONFIG,
            credentials=cluster.credentials(),
            transactional_id=f"bench-fill-{n}",
        )
        try:
            await producer.init_transactions(CALL_TIMEOUT_MS)
            for k in range(share):
                producer.begin_transaction()
                timed = await send_group(
                    producer, topic, preset.fill_records, preset.read_partitions, value
                )
                if (k + 1) % ABORT_EVERY == 0:
                    await producer.flush(CALL_TIMEOUT_MS / 1000)
                    if timed.acked() != preset.fill_records:
                        raise RuntimeError("a record of a transaction to abort was not acked")
                    await producer.abort_transaction(CALL_TIMEOUT_MS)
                    counts["aborted"] += preset.fill_records
                    counts["aborted_transactions"] += 1
                else:
                    await producer.commit_transaction(CALL_TIMEOUT_MS)
                    counts["committed"] += timed.acked()
                counts["transactions"] += 1
        finally:
            await producer.close(timeout_s=10)

    n = preset.fill_producers
    shares = [preset.fill_transactions // n + (1 if i < preset.fill_transactions % n else 0)
              for i in range(n)]  # fmt: skip
    await asyncio.gather(*(producer_loop(i, s) for i, s in enumerate(shares)))
    return counts


async def read_all(
    cluster: Cluster,
    tps: Sequence[TopicPartition],
    ends: dict[TopicPartition, int],
    isolation: IsolationLevel,
    timeout_s: float,
) -> tuple[int, float]:
    """The records a consumer at ``isolation`` returns reading ``tps`` from
    their start to ``ends``, and the seconds it took (from the positions
    known)."""
    config = ConsumerConfig(isolation_level=isolation)
    async with Consumer(cluster.brokers, config, credentials=cluster.credentials()) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        for tp in tps:
            await consumer.position(tp)
        records = 0
        t0 = time.perf_counter()
        deadline = now() + timeout_s
        while any((consumer.known_position(tp) or 0) < ends[tp] for tp in tps):
            records += len(await consumer.poll(timeout_ms=1_000))
            if now() > deadline:
                raise RuntimeError(f"{isolation.value}: the ends not reached in {timeout_s} s")
        return records, time.perf_counter() - t0


async def read(cluster: Cluster, preset: Preset) -> dict[str, Any]:
    topic = "bench-txn-read"
    await cluster.create_topic(topic, preset.read_partitions)
    await cluster.wait_topics([topic], 60, fully_replicated)
    t0 = now()
    counts = await fill(cluster, preset, topic)
    fill_s = now() - t0
    tps = [TopicPartition(topic, p) for p in range(preset.read_partitions)]
    ends = await settled_ends(cluster, tps, 60)
    levels = {
        "read_committed": IsolationLevel.READ_COMMITTED,
        "read_uncommitted": IsolationLevel.READ_UNCOMMITTED,
    }
    returned: dict[str, list[int]] = {name: [] for name in levels}
    seconds: dict[str, list[float]] = {name: [] for name in levels}
    for trial in range(preset.read_trials):
        # Each level goes first in every other trial: neither is always the
        # one reading just after the other (warm caches, garbage to collect).
        order = list(levels.items())
        for name, level in order if trial % 2 == 0 else order[::-1]:
            got, took = await read_all(cluster, tps, ends, level, 600)
            returned[name].append(got)
            seconds[name].append(took)
    offsets = sum(ends.values())
    out: dict[str, Any] = {
        "partitions": preset.read_partitions,
        "fill_producers": preset.fill_producers,
        "records_per_transaction": preset.fill_records,
        "abort_every": ABORT_EVERY,
        "fill_s": fill_s,
        **counts,
        "log_offsets": offsets,
    }
    for name in levels:
        median = percentile(seconds[name], 50)
        out[name] = {
            "trials": len(seconds[name]),
            "records_returned": returned[name],
            "seconds_p50": median,
            "per_trial_s": [round(s, 3) for s in seconds[name]],
            "records_per_s": returned[name][0] / median if median > 0 else None,
            "offsets_per_s": offsets / median if median > 0 else None,
        }
    rc, ru = out["read_committed"], out["read_uncommitted"]
    out["ratio_seconds"] = _ratio(rc["seconds_p50"], ru["seconds_p50"])
    out["ratio_records_per_s"] = _ratio(rc["records_per_s"], ru["records_per_s"])
    return out


# --------------------------------------------------------------------------
# Running and reporting

RUNNERS = {"txn": txn, "read": read}


async def run(preset_name: str, only: Sequence[str], directory: Path | None) -> dict[str, Any]:
    preset = PRESETS[preset_name]
    return await bench.run_sections(
        "transactions", preset_name, preset, RUNNERS, only, directory, preset.session_timeout_ms
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def format_text(doc: dict[str, Any]) -> str:
    lines, s = bench.text_head("transactions", doc)
    if "txn" in s:
        r = s["txn"]
        lines.append(
            f"== transactions of {r['value_bytes']}-byte records ({r['per_shape']} per shape and "
            f"series), peer: the same records sent idempotently and flushed "
            f"(per s; commit or flush p50 / p99 ms; whole p50 / p99 ms)"
        )
        for shape in r["shapes"].values():
            lines.append(
                f"   {_count(shape['records'], 'record')} over "
                f"{_count(shape['partitions'], 'partition')}"
            )
            for series in ("txn", "idempotent"):
                t = shape[series]
                end = f", first ack p50 {_ms(t['first_ack']['p50_ms'])}"
                if "end_txn" in t:
                    end += (
                        f", EndTxn {_ms(t['end_txn']['p50_ms'])} / {_ms(t['end_txn']['p99_ms'])}, "
                        f"{t['coordinator_requests_per_txn']:.2f} coordinator requests each"
                    )
                lines.append(
                    f"     {series:<10} {_rate(t['per_s']):>8}/s   commit "
                    f"{_ms(t['commit']['p50_ms']):>7} / {_ms(t['commit']['p99_ms']):>7}   whole "
                    f"{_ms(t['whole']['p50_ms']):>7} / {_ms(t['whole']['p99_ms']):>7}"
                    f"   ({t['done']} done, {t['errors']} errors{end})"
                )
            lines.append(
                f"     ratio      {_x(shape['ratio_per_s']):>10}   commit "
                f"{_x(shape['ratio_commit_p50']):>7} / {_x(shape['ratio_commit_p99']):>7}   whole "
                f"{_x(shape['ratio_whole_p50']):>7} / {_x(shape['ratio_whole_p99']):>7}"
            )
        lines.append(
            f"   log: {r['log_offsets']} offsets, {r['expected_log_offsets']} expected "
            f"(records sent and one marker per partition per transaction)"
        )
    if "read" in s:
        r = s["read"]
        lines.append(
            f"== read from start to end, {r['partitions']} partitions filled by "
            f"{r['fill_producers']} producers in {r['fill_s']:.1f} s: {r['transactions']} "
            f"transactions of {r['records_per_transaction']} records, "
            f"{r['aborted_transactions']} aborted; {r['committed']} committed and "
            f"{r['aborted']} aborted records in {r['log_offsets']} offsets"
        )
        for name in ("read_committed", "read_uncommitted"):
            t = r[name]
            lines.append(
                f"   {name:<16} {t['records_returned'][0]:>8} records in "
                f"{t['seconds_p50']:.3f} s (p50 of {t['trials']}): "
                f"{_rate(t['records_per_s'])} records/s, {_rate(t['offsets_per_s'])} offsets/s"
            )
        lines.append(
            f"   ratio            time {_x(r['ratio_seconds'])}, "
            f"records/s {_x(r['ratio_records_per_s'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench.bench_parser(__doc__.split("\n\n")[0], list(PRESETS), SECTIONS)
    args = bench.parse_bench_args(parser, argv)
    doc = asyncio.run(run(args.preset, args.only, args.dir))
    return bench.report(args, doc, format_text)


if __name__ == "__main__":
    sys.exit(main())

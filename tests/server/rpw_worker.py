"""A read-process-write loop, Kafka's exactly-once pattern, as a process of
its own (``python -m tests.server.rpw_worker CLUSTER_DIR TRANSACTIONAL_ID
GROUP SECONDS``): it consumes topic ``rpw-in`` in a consumer group at
read_committed and, for each poll, writes one record to ``rpw-out`` per
record read, in one transaction with the group's offsets of what it read
(``send_offsets_to_transaction``).  An abortable error aborts the
transaction and seeks back to the group's committed offsets; a fenced
producer (another process took the transactional id) leaves the group and
exits 3; an unknown outcome exits 4.  It runs ``SECONDS`` at most and
exits 0."""

from __future__ import annotations

import asyncio
import sys
import time

from broker.client.consumer import ConsumerConfig, IsolationLevel, OffsetResetStrategy
from broker.client.producer_batch import ProducerConfig
from broker.grpc_client import (
    BrokerClientError,
    Consumer,
    Producer,
    TransactionAbortableError,
    TransactionFatalError,
)
from server.local_cluster import broker_addresses, load_state

IN, OUT = "rpw-in", "rpw-out"
FENCED, UNKNOWN = 3, 4


async def rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets: what the aborted transaction
    read is read again."""
    assigned = consumer.assignment()
    if not assigned:
        return
    committed = await consumer.committed(assigned)
    for tp, at in committed.items():
        if at is None:
            consumer.seek_to_beginning([tp])
        else:
            consumer.seek(tp, at[0])


async def main(cluster_dir: str, tid: str, group: str, seconds: float) -> int:
    state = load_state(cluster_dir)
    assert state is not None
    tls = state.client_tls()
    bootstrap = broker_addresses(cluster_dir)
    consumer = Consumer(
        bootstrap,
        ConsumerConfig(
            isolation_level=IsolationLevel.READ_COMMITTED,
            auto_offset_reset=OffsetResetStrategy.EARLIEST,
            max_poll_records=50,
        ),
        tls=tls,
        request_timeout_ms=10_000,
        group_id=group,
        enable_auto_commit=False,
        max_poll_interval_ms=20_000,
    )
    producer = Producer(
        bootstrap,
        ProducerConfig(linger_ms=2, request_timeout_ms=10_000, delivery_timeout_ms=30_000),
        tls=tls,
        transactional_id=tid,
        transaction_timeout_ms=10_000,
    )
    consumer.subscribe([IN])
    try:
        await producer.init_transactions(60_000)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                records = await consumer.poll(500)
            except BrokerClientError as error:
                print(f"poll: {error}", flush=True)
                continue
            if not records:
                continue
            producer.begin_transaction()
            offsets: dict[tuple[str, int], int] = {}
            try:
                for r in records:
                    await producer.send(OUT, b"out-" + (r.value or b""), partition=r.partition)
                    offsets[(r.topic, r.partition)] = max(
                        offsets.get((r.topic, r.partition), 0), r.offset + 1
                    )
                await producer.send_offsets_to_transaction(
                    offsets, consumer.group_metadata(), 30_000
                )
                await producer.commit_transaction(30_000)
            except TransactionAbortableError as error:
                print(f"aborted: {error}", flush=True)
                await producer.abort_transaction(30_000)
                await rewind(consumer)
            except TransactionFatalError as error:
                print(f"fenced: {error}", flush=True)
                return FENCED
            except BrokerClientError as error:
                print(f"unknown: {error}", flush=True)
                return UNKNOWN
        return 0
    finally:
        await producer.close(5)
        await consumer.close(5_000)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))))

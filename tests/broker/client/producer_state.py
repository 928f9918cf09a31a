"""An idempotent producer's bookkeeping without a broker, for the tests that
answer its batches by hand (``test_sequencing``, ``test_reordered_requests``,
the queue workload's outcomes in ``tests/chaos/test_workload_queue``): a
record accumulator whose every record is a batch of its own, put, drained
and answered at chosen times."""

from __future__ import annotations

import random

from broker.client.accumulator import ProduceAnswer, RecordAccumulator
from broker.client.producer_batch import ProducerBatch, ProducerConfig, RecordFuture, TopicPartition
from broker.client.sequencing import Sequencing
from broker.errors import Errors
from partition_log.batch import Compression, verify

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
LEADERS = {TP: 1}


def make(idempotent: bool = True, **overrides: object) -> RecordAccumulator:
    """An accumulator sending at once, one record a batch (70 bytes), with
    producer id 9 at epoch 3 if ``idempotent``; ``overrides`` are more
    :class:`ProducerConfig` settings."""
    settings: dict[str, object] = {
        "linger_ms": 0,
        "batch_size": 70,
        "retry_backoff_ms": 0,
        "enable_idempotence": idempotent,
    }
    settings.update(overrides)
    acc = RecordAccumulator(ProducerConfig(**settings), random.Random(0))  # type: ignore[arg-type]
    if idempotent:
        acc.sequencing.set_producer_id(9, 3)
    return acc


def make_kafka() -> RecordAccumulator:
    """As :func:`make`, reading OUT_OF_ORDER_SEQUENCE_NUMBER as Kafka's
    ``TransactionManager.canRetry`` does (what the queue workload runs,
    ``queue_setup``)."""
    acc = RecordAccumulator(
        ProducerConfig(linger_ms=0, batch_size=70, retry_backoff_ms=0),
        random.Random(0),
        Sequencing(idempotent=True, kafka_out_of_order=True),
    )
    acc.sequencing.set_producer_id(9, 3)
    return acc


def put(acc: RecordAccumulator, value: bytes, topic: str = TOPIC) -> RecordFuture:
    # 25 bytes of padding: every record is a batch of its own.
    return acc.append(topic, None, value + b"." * 25, now_ms=0, partitions=1)


def send(acc: RecordAccumulator, now: int = 0, topic: str = TOPIC) -> list[ProducerBatch]:
    """The batches of partition 0 of ``topic`` (led by node 1) drained at
    ``now``."""
    leaders = {TopicPartition(topic, 0): 1}
    ready = acc.ready(now, leaders)
    return [b for r in acc.drain(now, leaders, ready.nodes).values() for b in r.batches]


def send_all(acc: RecordAccumulator, now: int = 0, topic: str = TOPIC) -> list[ProducerBatch]:
    sent: list[ProducerBatch] = []
    while batches := send(acc, now, topic):
        sent += batches
    return sent


def send_one(
    acc: RecordAccumulator, value: bytes = b"a", topic: str = TOPIC
) -> tuple[RecordFuture, ProducerBatch]:
    """One record put and sent at 0: its future and its batch."""
    future = put(acc, value, topic)
    (batch,) = send(acc, 0, topic)
    return future, batch


def send_two(
    acc: RecordAccumulator, values: tuple[bytes, bytes] = (b"a", b"b"), topic: str = TOPIC
) -> tuple[tuple[RecordFuture, RecordFuture], tuple[ProducerBatch, ProducerBatch]]:
    """Two records put and sent at 0, each in a batch of its own: their
    futures and their batches, in sequence order."""
    futures = put(acc, values[0], topic), put(acc, values[1], topic)
    first, second = send_all(acc, 0, topic)
    return futures, (first, second)


def resend_after_a_timeout(
    acc: RecordAccumulator, batch: ProducerBatch, topic: str = TOPIC
) -> ProducerBatch:
    """``batch`` answered REQUEST_TIMED_OUT at 1 (an attempt that may have
    been written) and sent again at 2: the batch sent."""
    acc.on_answer(batch, ProduceAnswer(Errors.REQUEST_TIMED_OUT), 1)
    (again,) = send(acc, 2, topic)
    return again


def header_of(batch: ProducerBatch) -> tuple[int, int, int]:
    h = verify(batch.payload(Compression.NONE))
    return h.producer_id, h.producer_epoch, h.base_sequence

"""The record accumulator's rules (Kafka's RecordAccumulator and Sender):
batching, readiness, draining, the in-flight limit, retries in order,
buffer memory, delivery timeouts, acks=0, compression, flush and close."""

from __future__ import annotations

import random

import pytest

from broker.client.accumulator import ProduceAnswer, RecordAccumulator
from broker.client.errors import (
    BufferExhaustedError,
    Outcome,
    ProducerClosedError,
    RecordTooLargeError,
)
from broker.client.partitioner import partition_for_key
from broker.client.producer_batch import (
    Acks,
    ProducerBatch,
    ProducerConfig,
    RecordFuture,
    TopicPartition,
    record_size,
)
from broker.errors import Errors
from partition_log.batch import Compression, decode_records, verify

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
LEADERS = {TP0: 1, TP1: 1}


def make(**overrides: object) -> RecordAccumulator:
    settings: dict[str, object] = {"linger_ms": 10}
    settings.update(overrides)
    acc = RecordAccumulator(ProducerConfig(**settings), random.Random(0))  # type: ignore[arg-type]
    if acc.sequencing.idempotent:
        acc.sequencing.set_producer_id(42, 0)
    return acc


def put(acc: RecordAccumulator, value: bytes, now: int = 0, partition: int = 0) -> RecordFuture:
    return acc.append("t", None, value, now_ms=now, partitions=2, partition=partition)


def send(acc: RecordAccumulator, now: int) -> list[ProducerBatch]:
    ready = acc.ready(now, LEADERS)
    return [b for r in acc.drain(now, LEADERS, ready.nodes).values() for b in r.batches]


# -- batching -----------------------------------------------------------------


def test_records_share_a_batch_until_batch_size() -> None:
    acc = make(batch_size=200)
    for i in range(20):
        put(acc, b"value-%02d" % i)
    batches = acc.queued(TP0)
    assert len(batches) > 1
    assert all(b.size_bytes <= 200 for b in batches)
    assert sum(b.record_count for b in batches) == 20
    # The estimate is the batch's exact size, uncompressed.
    for batch in batches:
        assert batch.size_bytes == len(batch.payload(Compression.NONE))


def test_a_record_larger_than_batch_size_gets_its_own_batch() -> None:
    acc = make(batch_size=100)
    put(acc, b"small")
    put(acc, b"x" * 500)
    assert [b.record_count for b in acc.queued(TP0)] == [1, 1]


def test_record_too_large_is_refused_at_once() -> None:
    acc = make(max_request_size=1000)
    with pytest.raises(RecordTooLargeError, match="max_request_size 1000"):
        put(acc, b"x" * 1000)
    assert acc.incomplete == 0


def test_buffer_memory_refuses_then_frees_on_completion() -> None:
    acc = make(buffer_memory=400, batch_size=100, linger_ms=0)
    put(acc, b"a" * 100)  # 170 bytes as a batch
    put(acc, b"b" * 100)
    with pytest.raises(BufferExhaustedError, match="buffer_memory 400"):
        put(acc, b"c" * 100)
    (batch,) = send(acc, 0)[:1]
    acc.on_answer(batch, ProduceAnswer(base_offset=0), 1)
    put(acc, b"c" * 100)


def test_record_size_matches_the_encoder() -> None:
    acc = make()
    put(acc, b"v")
    batch = acc.queued(TP0)[0]
    assert batch.size_bytes == 61 + record_size(0, 0, None, b"v", ())


# -- readiness ----------------------------------------------------------------


def test_ready_after_linger_ms() -> None:
    acc = make(linger_ms=10)
    put(acc, b"v", now=100)
    check = acc.ready(105, LEADERS)
    assert check.nodes == frozenset()
    assert check.next_ready_check_ms == 110
    assert acc.ready(110, LEADERS).nodes == {1}


def test_ready_when_full_before_linger() -> None:
    acc = make(linger_ms=10_000, batch_size=200)
    put(acc, b"a" * 80)
    assert acc.ready(0, LEADERS).nodes == frozenset()
    put(acc, b"b" * 80)  # no room: a second batch, and the first is full
    assert acc.ready(0, LEADERS).nodes == {1}
    assert len(send(acc, 0)) == 1  # only the full one goes


def test_ready_while_flushing_and_done_when_complete() -> None:
    acc = make(linger_ms=10_000)
    future = put(acc, b"v")
    flush = acc.begin_flush()
    assert not flush.done
    (batch,) = send(acc, 0)
    acc.on_answer(batch, ProduceAnswer(base_offset=7), 1)
    assert flush.done
    assert future.offset == 7
    put(acc, b"w", now=2)
    assert acc.ready(2, LEADERS).nodes == frozenset()  # the flush ended


def test_ready_once_closed() -> None:
    acc = make(linger_ms=10_000)
    put(acc, b"v")
    acc.close()
    assert acc.ready(0, LEADERS).nodes == {1}
    with pytest.raises(ProducerClosedError):
        put(acc, b"w")


def test_unknown_leader_is_reported() -> None:
    acc = make(linger_ms=0)
    put(acc, b"v")
    check = acc.ready(0, {TP0: None})
    assert check.nodes == frozenset()
    assert check.unknown_leader_topics == {"t"}


# -- draining -----------------------------------------------------------------


def test_drain_takes_one_batch_per_partition_and_rotates() -> None:
    acc = make(linger_ms=0, batch_size=100, max_request_size=300)
    for _ in range(3):
        put(acc, b"a" * 60, partition=0)
        put(acc, b"b" * 60, partition=1)
    first = send(acc, 0)
    assert sorted(b.topic_partition.partition for b in first) == [0, 1]
    for b in first:
        acc.on_answer(b, ProduceAnswer(base_offset=0), 0)
    # A request holds at most max_request_size: one 130-byte batch each
    # time, two fit 300; the start partition rotates so none starves.
    acc2 = make(linger_ms=0, batch_size=200, max_request_size=200)
    for _ in range(4):
        put(acc2, b"a" * 100, partition=0)
        put(acc2, b"b" * 100, partition=1)
    order = []
    for now in range(4):
        for b in send(acc2, now):
            order.append(b.topic_partition.partition)
            acc2.on_answer(b, ProduceAnswer(base_offset=0), now)
    assert order == [0, 1, 0, 1]


def test_at_most_five_batches_in_flight_per_partition() -> None:
    acc = make(linger_ms=0, batch_size=70)
    for i in range(8):
        put(acc, b"v%02d" % i + b"x" * 20)
    sent = []
    for now in range(8):
        sent += send(acc, now)
    assert len(sent) == 5 and acc.awaiting(TP0) == 5
    assert acc.ready(10, LEADERS).nodes == frozenset()
    acc.on_answer(sent[0], ProduceAnswer(base_offset=0), 10)
    assert len(send(acc, 10)) == 1


def test_idempotent_batches_get_sequences_in_drain_order() -> None:
    acc = make(linger_ms=0, batch_size=80)
    for i in range(6):
        put(acc, b"record-%d" % i)
    sent = []
    for now in range(3):
        sent += send(acc, now)
    bases = [b.base_sequence for b in sent]
    counts = [b.record_count for b in sent]
    assert bases == [sum(counts[:i]) for i in range(len(sent))]
    header = verify(sent[1].payload(Compression.NONE))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 0, bases[1])


# -- retries ------------------------------------------------------------------


def test_retry_waits_for_its_backoff_and_keeps_its_sequence() -> None:
    acc = make(linger_ms=0, retry_backoff_ms=100, retry_backoff_max_ms=1000)
    put(acc, b"v")
    (batch,) = send(acc, 0)
    acc.on_answer(batch, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 0)
    assert 80 <= batch.retry_at_ms <= 120  # 100 ms, 20% jitter
    assert send(acc, batch.retry_at_ms - 1) == []
    assert send(acc, batch.retry_at_ms) == [batch]
    assert batch.base_sequence == 0 and batch.attempts == 2
    acc.on_answer(batch, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1000)
    # Exponential (KIP-580): 200 ms +- 20% after the second attempt.
    assert 1160 <= batch.retry_at_ms <= 1240


def test_retries_are_queued_in_sequence_order_before_new_batches() -> None:
    acc = make(linger_ms=0, batch_size=70, retry_backoff_ms=0)
    for i in range(3):
        put(acc, b"v%d" % i + b"x" * 25)  # a batch each
    sent = []
    for now in range(3):
        sent += send(acc, now)
    assert len(sent) == 3
    put(acc, b"fresh", now=4)
    # Answers come back out of order: the third, then the first.
    acc.on_answer(sent[2], ProduceAnswer(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER), 5)
    acc.on_answer(sent[0], ProduceAnswer(Errors.NOT_LEADER_OR_FOLLOWER), 5)
    queue = acc.queued(TP0)
    assert [b.base_sequence for b in queue[:2]] == [sent[0].base_sequence, sent[2].base_sequence]
    assert not queue[2].has_sequence


def test_only_the_first_unacknowledged_sequence_is_retried() -> None:
    acc = make(linger_ms=0, batch_size=70, retry_backoff_ms=0)
    for i in range(2):
        put(acc, b"v%d" % i + b"x" * 25)
    first, second = send(acc, 0) + send(acc, 1)
    acc.on_answer(second, ProduceAnswer(Errors.REQUEST_TIMED_OUT), 2)
    # The second is queued again but must wait: the first still awaits.
    assert send(acc, 3) == []
    acc.on_answer(first, ProduceAnswer(base_offset=0), 4)
    assert send(acc, 5) == [second]


def test_retries_exhausted_fail_the_batch() -> None:
    acc = make(linger_ms=0, retries=1, retry_backoff_ms=0)
    future = put(acc, b"v")
    (batch,) = send(acc, 0)
    acc.on_answer(batch, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 1)
    (batch,) = send(acc, 2)
    acc.on_answer(batch, ProduceAnswer(Errors.NOT_ENOUGH_REPLICAS), 3)
    assert future.error is not None and future.error.name == "NOT_ENOUGH_REPLICAS"
    assert future.outcome is Outcome.FAIL


# -- delivery timeout ---------------------------------------------------------


def test_a_queued_batch_expires_as_a_definite_failure() -> None:
    acc = make(linger_ms=0, request_timeout_ms=100, delivery_timeout_ms=1000)
    future = put(acc, b"v")
    assert acc.expire(999) == []
    assert len(acc.expire(1000)) == 1
    assert future.outcome is Outcome.FAIL
    assert future.error is not None
    assert "1000 ms has passed since batch creation" in future.error.message
    assert acc.incomplete == 0 and acc.buffered_bytes == 0


def test_a_batch_awaiting_its_answer_expires_as_unknown_and_late_answers_are_ignored() -> None:
    acc = make(linger_ms=0, request_timeout_ms=100, delivery_timeout_ms=1000)
    future = put(acc, b"v")
    (batch,) = send(acc, 0)
    acc.expire(1000)
    assert future.outcome is Outcome.INFO
    acc.on_answer(batch, ProduceAnswer(base_offset=3), 1001)
    assert future.offset is None
    # The gap left by the expired sequence asks for a new epoch.
    assert acc.sequencing.bump_required(TP0)


# -- acks=0, compression, close ----------------------------------------------


def test_acks_zero_completes_on_send_with_an_unknown_offset() -> None:
    acc = make(linger_ms=0, acks=Acks.NONE, enable_idempotence=False)
    future = put(acc, b"v")
    send(acc, 0)
    assert future.done and future.offset == -1
    assert future.outcome is Outcome.INFO


@pytest.mark.parametrize("codec", list(Compression)[1:])
def test_batches_are_compressed_when_sealed(codec: Compression) -> None:
    acc = make(linger_ms=0, compression_type=codec)
    for i in range(50):
        put(acc, b"the same value again %d" % (i % 3))
    (batch,) = send(acc, 0)
    payload = batch.payload(codec)
    header = verify(payload)
    assert header.compression is codec
    assert len(payload) < batch.size_bytes
    assert [r.value for r in decode_records(payload)] == [r.value for r in batch.records]


def test_abort_incomplete_fails_everything() -> None:
    acc = make(linger_ms=0)
    sent_future = put(acc, b"a")
    send(acc, 0)
    queued_future = put(acc, b"b")
    acc.abort_incomplete(1)
    assert sent_future.outcome is Outcome.INFO
    assert queued_future.outcome is Outcome.FAIL
    assert acc.incomplete == 0


# -- partitioning through append ----------------------------------------------


def test_keyed_records_use_murmur2_and_unkeyed_stick() -> None:
    acc = make(batch_size=1000, linger_ms=10_000)
    keyed = acc.append("k", b"user-1", b"v", now_ms=0, partitions=7)
    assert keyed.topic_partition.partition == partition_for_key(b"user-1", 7)
    partitions = {
        acc.append(
            "s", None, b"x" * 50, now_ms=0, partitions=7, available=range(7)
        ).topic_partition.partition
        for _ in range(10)
    }
    assert len(partitions) == 1  # 10 x ~60 bytes < batch.size: one partition
    for _ in range(40):
        acc.append("s", None, b"x" * 50, now_ms=0, partitions=7, available=range(7))
    used = {tp.partition for tp in acc._queues if tp.topic == "s"}
    assert len(used) > 1  # it switched after batch.size bytes


# -- configs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"acks": Acks.LEADER}, "requires acks=all"),
        ({"max_in_flight_requests_per_connection": 6}, "<= 5"),
        ({"retries": 0}, "retries > 0"),
        ({"delivery_timeout_ms": 1000}, "at least linger_ms"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"linger_ms": -1}, "linger_ms must be >= 0"),
    ],
)
def test_bad_configs_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProducerConfig(**settings)  # type: ignore[arg-type]


def test_defaults_are_kafkas() -> None:
    config = ProducerConfig()
    assert (config.acks, config.enable_idempotence, config.batch_size) == (Acks.ALL, True, 16384)
    assert config.max_in_flight_requests_per_connection == 5
    assert config.delivery_timeout_ms == 120_000 and config.buffer_memory == 32 * 1024 * 1024


def test_the_sticky_switch_waits_for_a_full_batch() -> None:
    # KIP-794: after batch.size bytes the switch is held back while the
    # partition's last batch is not full (RecordAccumulator.allBatchesFull).
    acc = make(batch_size=100, linger_ms=10_000)
    first = acc.append("s", None, b"x" * 30, now_ms=0, partitions=50, available=range(50))
    # No room for a second 30-byte record: a new batch, 182 bytes produced.
    second = acc.append("s", None, b"y" * 30, now_ms=0, partitions=50, available=range(50))
    assert second.topic_partition == first.topic_partition
    sticky = acc._sticky["s"]
    assert sticky._current == first.topic_partition.partition
    assert sticky._produced >= 100  # past batch.size, yet no switch


def test_ready_weighs_the_sticky_partitioner_by_queue_sizes() -> None:
    acc = make(batch_size=70, linger_ms=10_000)
    leaders = {TopicPartition("s", p): 1 for p in range(3)}
    acc.append("s", None, b"x", now_ms=0, partitions=3, available=range(3))
    sticky = acc._sticky["s"]
    acc.ready(0, leaders)
    assert sticky._load is None  # not every partition has had a batch yet
    for partition, batches in ((0, 1), (1, 3), (2, 2)):
        for _ in range(batches - len(acc.queued(TopicPartition("s", partition)))):
            acc.append("s", None, b"y" * 20, now_ms=0, partitions=3, partition=partition)
    sizes = [len(acc.queued(TopicPartition("s", p))) for p in range(3)]
    acc.ready(0, leaders)
    assert sticky._load is not None
    table, ids = sticky._load
    top = max(sizes) + 1
    assert ids == [0, 1, 2]
    assert table == [sum(top - s for s in sizes[: i + 1]) for i in range(3)]
    off = make(batch_size=70, linger_ms=10_000, partitioner_adaptive_partitioning_enable=False)
    for partition in range(3):
        off.append("s", None, b"x", now_ms=0, partitions=3, partition=partition)
    off.append("s", None, b"x", now_ms=0, partitions=3, available=range(3))
    off.ready(0, leaders)
    assert off._sticky["s"]._load is None


@pytest.mark.parametrize(
    ("code", "refresh"),
    [
        (Errors.NOT_LEADER_OR_FOLLOWER, True),
        # The leader could not gather its acks: it may be cut off, its
        # partition given to another broker since.
        (Errors.REQUEST_TIMED_OUT, True),
        (Errors.NOT_ENOUGH_REPLICAS, False),
        (Errors.CORRUPT_MESSAGE, False),
    ],
)
def test_which_answers_refresh_the_metadata_before_the_retry(code: Errors, refresh: bool) -> None:
    acc = make(linger_ms=0, retry_backoff_ms=0)
    put(acc, b"v")
    (batch,) = send(acc, 0)
    assert acc.on_answer(batch, ProduceAnswer(code), 1).refresh_metadata is refresh
    # No answer at all (NETWORK_EXCEPTION) refreshes too.
    (batch,) = send(acc, 2)
    assert acc.on_network_failure(batch, 3).refresh_metadata

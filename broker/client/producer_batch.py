"""The producer's records in flight: the per-record handle (Kafka's
``FutureRecordMetadata``), the batch of one partition (``ProducerBatch``)
and the producer's configs (``ProducerConfig``, Kafka's names and
defaults).

A batch is mutable bookkeeping that the accumulator and the sequencing
share: its attempts, its producer id, epoch and base sequence once drained,
whether an attempt may have been written, and its futures. Its bytes are
built by ``partition_log.batch.build_batch`` when it is sent, with offsets
0..n-1 (the leader assigns the real ones).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.client.errors import DeliveryError, Outcome
from partition_log.batch import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    Compression,
    build_batch,
)
from partition_log.records import Header, Record, encode_varint

__all__ = [
    "Acks",
    "ProducerBatch",
    "ProducerConfig",
    "RecordFuture",
    "TopicPartition",
    "fields_size",
    "placed_size",
    "record_size",
]

INT32_MAX = 2**31 - 1


class Acks(enum.IntEnum):
    """``acks``: 0 (no answer), 1 (the leader's append), -1 (``all``: the
    HW passed the batch)."""

    NONE = 0
    LEADER = 1
    ALL = -1


class TopicPartition(NamedTuple):
    """A topic's partition (a named tuple: hashed on every append)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """The producer's configs with Kafka's names (``ProducerConfig``) and
    defaults (Kafka 4.0: idempotence and acks=all by default, KIP-679;
    linger.ms 5, KIP-1030)."""

    acks: Acks = Acks.ALL
    enable_idempotence: bool = True
    batch_size: int = 16_384
    linger_ms: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    max_in_flight_requests_per_connection: int = 5
    retries: int = INT32_MAX
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    compression_type: Compression = Compression.NONE
    max_request_size: int = 1_048_576
    max_block_ms: int = 60_000
    # KIP-794: weigh the sticky partitioner's choices by queue sizes.
    partitioner_adaptive_partitioning_enable: bool = True

    def __post_init__(self) -> None:
        for name in (
            "batch_size",
            "buffer_memory",
            "max_in_flight_requests_per_connection",
            "request_timeout_ms",
            "max_request_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, not {getattr(self, name)}")
        for name in (
            "linger_ms",
            "retries",
            "delivery_timeout_ms",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
            "max_block_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, not {getattr(self, name)}")
        Acks(self.acks)
        if self.enable_idempotence:
            # ProducerConfig.postProcessAndValidateIdempotenceConfigs.
            if self.acks is not Acks.ALL:
                raise ValueError(
                    f"enable_idempotence requires acks=all (-1), not acks={int(self.acks)}"
                )
            if self.max_in_flight_requests_per_connection > 5:
                raise ValueError(
                    "enable_idempotence requires max_in_flight_requests_per_connection <= 5, "
                    f"not {self.max_in_flight_requests_per_connection}"
                )
            if self.retries < 1:
                raise ValueError("enable_idempotence requires retries > 0")
        # KafkaProducer.configureDeliveryTimeout.
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError(
                f"delivery_timeout_ms {self.delivery_timeout_ms} must be at least linger_ms + "
                f"request_timeout_ms ({self.linger_ms + self.request_timeout_ms})"
            )


def _varint_size(value: int) -> int:
    """Bytes of ``value`` as a zigzag varint (one or two for most fields)."""
    z = (value << 1) ^ (value >> 63)
    if z < 0x80:
        return 1
    if z < 0x4000:
        return 2
    return len(encode_varint(value))


def fields_size(key: bytes | None, value: bytes | None, headers: tuple[Header, ...]) -> int:
    """Bytes of a record's key, value and headers in a batch (the part of
    ``DefaultRecord.sizeInBytes`` that does not depend on its place)."""
    size = 1 if key is None else _varint_size(len(key)) + len(key)
    size += 1 if value is None else _varint_size(len(value)) + len(value)
    size += _varint_size(len(headers))
    for header_key, header_value in headers:
        raw = header_key.encode("utf-8")
        size += _varint_size(len(raw)) + len(raw)
        size += 1 if header_value is None else _varint_size(len(header_value)) + len(header_value)
    return size


def placed_size(fields: int, offset_delta: int, timestamp_delta: int) -> int:
    """Bytes of a record whose fields take ``fields`` bytes, at its deltas
    (length, attributes, the two deltas, the fields)."""
    body = 1 + _varint_size(timestamp_delta) + _varint_size(offset_delta) + fields
    return _varint_size(body) + body


def record_size(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[Header, ...],
) -> int:
    """Bytes of one record in a batch, uncompressed (``DefaultRecord.sizeInBytes``)."""
    return placed_size(fields_size(key, value, headers), offset_delta, timestamp_delta)


class RecordFuture:
    """The handle :meth:`RecordAccumulator.append` returns for one record
    (``FutureRecordMetadata``). It resolves once: with the record's offset
    (``-1`` when unknown: acks=0, or a duplicate the broker no longer has
    the offsets of), or with a :class:`DeliveryError`."""

    __slots__ = ("_callbacks", "_done", "error", "index", "offset", "outcome", "topic_partition")

    def __init__(self, topic_partition: TopicPartition, index: int) -> None:
        self.topic_partition = topic_partition
        self.index = index
        self.offset: int | None = None
        self.error: DeliveryError | None = None
        self.outcome: Outcome | None = None
        self._done = False
        self._callbacks: list[Callable[[RecordFuture], None]] = []

    @property
    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[RecordFuture], None]) -> None:
        """Call ``callback(self)`` once resolved (at once if it is)."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _resolve(self, offset: int | None, error: DeliveryError | None, outcome: Outcome) -> None:
        if self._done:
            raise RuntimeError(f"record {self.index} of {self.topic_partition} resolved twice")
        self._done = True
        self.offset = offset
        self.error = error
        self.outcome = outcome
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def __repr__(self) -> str:
        state = "pending" if not self._done else (self.error or f"offset {self.offset}")
        return f"RecordFuture({self.topic_partition}#{self.index}: {state})"


@dataclass(eq=False, slots=True)
class ProducerBatch:
    """The records of one partition sent together (Kafka's ``ProducerBatch``)."""

    topic_partition: TopicPartition
    created_ms: int
    records: list[Record] = field(default_factory=list, repr=False)
    futures: list[RecordFuture] = field(default_factory=list, repr=False)
    size_bytes: int = HEADER_SIZE
    # No more appends (full, or drained once).
    closed: bool = False
    attempts: int = 0
    last_attempt_ms: int = -1
    # Not drained again before this time (the retry backoff).
    retry_at_ms: int = 0
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    # Sent and not answered yet.
    awaiting: bool = False
    # Some attempt ended without telling whether it was written.
    maybe_written: bool = False
    # The last attempt was sent while a batch of a lower sequence of its
    # partition awaited an answer: the broker may have received it first
    # (separate gRPC calls keep no order, unlike Kafka's one connection).
    sent_behind: bool = False
    # Part of a transaction: written with the transactional attribute.
    transactional: bool = False
    done: bool = False
    # The codes of the answers so far, oldest first (for messages and tests).
    answers: list[int] = field(default_factory=list)
    _payload: bytes | None = field(default=None, repr=False)
    _payload_key: tuple[int, int, int, int] | None = field(default=None, repr=False)

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    @property
    def last_sequence(self) -> int:
        # Wrapping past 2^31-1 as DefaultRecordBatch.incrementSequence.
        return (self.base_sequence + self.record_count - 1) % (INT32_MAX + 1)

    def has_room_for(self, size: int, batch_size: int) -> bool:
        # MemoryRecordsBuilder.hasRoomFor: a record always fits an empty batch.
        return not self.closed and (not self.records or self.size_bytes + size <= batch_size)

    def set_producer_state(self, producer_id: int, epoch: int, base_sequence: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = epoch
        self.base_sequence = base_sequence

    def clear_producer_state(self) -> None:
        self.set_producer_state(NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)

    def payload(self, compression: Compression) -> bytes:
        """The batch's bytes with its current producer state (built again
        only when that changed, as Kafka reopens the builder to rewrite it)."""
        key = (int(compression), self.producer_id, self.producer_epoch, self.base_sequence)
        if self._payload is None or self._payload_key != key:
            self._payload = build_batch(
                self.records,
                base_offset=0,
                compression=compression,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                transactional=self.transactional,
            )
            self._payload_key = key
        return self._payload

    def complete(self, base_offset: int, outcome: Outcome = Outcome.OK) -> bool:
        """Resolve every future with ``base_offset`` + its index (-1 stays
        -1); False if the batch was already done (a late answer)."""
        if self.done:
            return False
        self.done = True
        for future in self.futures:
            future._resolve(-1 if base_offset < 0 else base_offset + future.index, None, outcome)
        return True

    def fail(self, error: DeliveryError) -> bool:
        if self.done:
            return False
        self.done = True
        for future in self.futures:
            future._resolve(None, error, error.outcome)
        return True

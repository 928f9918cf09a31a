"""Blocking wrappers of the producer and consumer for callers without an
event loop (the commands, scripts): each runs its client on a private event
loop in a daemon thread, as Kafka's producer runs its ``Sender`` thread.

``SyncProducer.send`` returns a ``concurrent.futures.Future`` of
:class:`RecordMetadata` at once (after the record is queued); ``flush`` and
``close`` block. ``SyncConsumer.poll`` blocks up to its timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Self, TypeVar

from broker.client.consumer import ConsumerRecord
from broker.client.producer_batch import TopicPartition
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.producer import Producer, RecordMetadata
from partition_log.records import Header

__all__ = ["LoopThread", "SyncConsumer", "SyncProducer"]

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; :meth:`run` calls a coroutine on it
    and waits for its result."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, make: Callable[[], T]) -> T:
        """Build an object on the loop's thread (asyncio objects bind there)."""

        async def build() -> T:
            return make()

        return self.run(build())

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


class SyncProducer:
    """A :class:`Producer` behind blocking calls (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._thread = LoopThread("kq-producer")
        self.producer: Producer = self._thread.call(lambda: Producer(*args, **kwargs))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue a record (blocking while ``send`` waits for metadata or
        buffer memory); the future resolves once it is acknowledged."""
        out: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()

        async def queue() -> None:
            future = await self.producer.send(topic, value, key, partition, headers, timestamp_ms)

            def done(f: asyncio.Future[RecordMetadata]) -> None:
                error = f.exception()
                if error is not None:
                    out.set_exception(error)
                else:
                    out.set_result(f.result())

            future.add_done_callback(done)

        self._thread.run(queue())
        return out

    def partitions_for(self, topic: str, max_wait_ms: int | None = None) -> int:
        """The topic's partition count (Kafka's ``partitionsFor``), waiting
        up to ``max_wait_ms`` (default ``max.block.ms``) for it to appear;
        ``UnknownTopicError`` after that."""
        wait = self.producer.config.max_block_ms if max_wait_ms is None else max_wait_ms
        return self._thread.run(self.producer.metadata.partition_count(topic, wait))

    def flush(self, timeout_s: float | None = None) -> None:
        self._thread.run(self.producer.flush(timeout_s))

    # -- transactions (a producer made with a transactional id) -----------------------

    def init_transactions(self, timeout_ms: int | None = None) -> None:
        self._thread.run(self.producer.init_transactions(timeout_ms))

    def begin_transaction(self) -> None:
        self._thread.call(self.producer.begin_transaction)

    def commit_transaction(self, timeout_ms: int | None = None) -> None:
        self._thread.run(self.producer.commit_transaction(timeout_ms))

    def abort_transaction(self, timeout_ms: int | None = None) -> None:
        self._thread.run(self.producer.abort_transaction(timeout_ms))

    def close(self, timeout_s: float | None = None) -> None:
        try:
            self._thread.run(self.producer.close(timeout_s))
        finally:
            self._thread.stop()


class SyncConsumer:
    """A :class:`Consumer` behind blocking calls (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._thread = LoopThread("kq-consumer")
        self.consumer: Consumer = self._thread.call(lambda: Consumer(*args, **kwargs))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        chosen = list(partitions)
        self._thread.call(lambda: self.consumer.assign(chosen))

    def seek(self, partition: TopicPartition | tuple[str, int], offset: int) -> None:
        self._thread.call(lambda: self.consumer.seek(partition, offset))

    def seek_to_beginning(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> None:
        self._thread.call(lambda: self.consumer.seek_to_beginning(partitions))

    def seek_to_end(
        self, partitions: Iterable[TopicPartition | tuple[str, int]] | None = None
    ) -> None:
        self._thread.call(lambda: self.consumer.seek_to_end(partitions))

    def position(self, partition: TopicPartition | tuple[str, int]) -> int:
        return self._thread.run(self.consumer.position(partition))

    def poll(self, timeout_ms: int = 1_000, max_records: int | None = None) -> list[ConsumerRecord]:
        return self._thread.run(self.consumer.poll(timeout_ms, max_records))

    def close(self) -> None:
        try:
            self._thread.run(self.consumer.close())
        finally:
            self._thread.stop()

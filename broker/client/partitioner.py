"""Which partition a record goes to, as Kafka's Java producer decides it.

Keyed records: ``toPositive(murmur2(key)) % partitions``
(``BuiltInPartitioner.partitionForKey``, ``Utils.murmur2``,
``Utils.toPositive``), bit for bit, so that a key lands on the partition a
Java producer would pick for it.

Records without a key: the built-in sticky partitioner of KIP-794
(``BuiltInPartitioner``): stick to one partition until ``batch.size`` bytes
were produced to it, then switch to a random partition among those with a
leader (all partitions when none has one). Like Kafka, the switch may be
held back while the current batch is not ready (``enable_switch``), but not
past twice ``batch.size``. With KIP-794's adaptive partitioning
(``partitioner.adaptive.partitioning.enable``, on by default) the next
partition is drawn with weights from the partitions' queue sizes (a shorter
queue is likelier, ``updatePartitionLoadStats``); without load statistics
it is uniform over the partitions with a leader.
``partitioner.availability.timeout.ms`` (off by default) is not
implemented.

Pure: randomness is an injected ``random.Random``.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key", "to_positive"]

_MASK32 = 0xFFFFFFFF


def _int32(value: int) -> int:
    """Java's ``int`` wrap-around of ``value``."""
    value &= _MASK32
    return value - (1 << 32) if value & 0x80000000 else value


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` as a signed Java ``int``
    (``Utils.murmur2``: seed 0x9747b28c, little-endian 4-byte words)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"murmur2 hashes bytes, not {type(data).__name__}")
    data = bytes(data)
    length = len(data)
    m = 0x5BD1E995
    h = (0x9747B28C ^ length) & _MASK32
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK32
        k ^= k >> 24
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    rest = length & 3
    # The switch with fall-through of Utils.murmur2.
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return _int32(h)


def to_positive(number: int) -> int:
    """``Utils.toPositive``: the sign bit cleared (not ``abs``, which would
    fail on ``Integer.MIN_VALUE``)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record (``BuiltInPartitioner.partitionForKey``)."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return to_positive(murmur2(key)) % partitions


class StickyPartitioner:
    """The sticky partitioner of one topic (KIP-794 ``BuiltInPartitioner``
    without adaptive weighting).

    :meth:`partition` is the partition the next record without a key goes
    to; :meth:`record_appended` counts the bytes appended to it and switches
    once ``sticky_batch_size`` (``batch.size``) were produced."""

    def __init__(self, topic: str, sticky_batch_size: int, rng: random.Random) -> None:
        if sticky_batch_size < 1:
            raise ValueError(f"sticky_batch_size must be >= 1, not {sticky_batch_size}")
        self.topic = topic
        self.sticky_batch_size = sticky_batch_size
        self._rng = rng
        self._current: int | None = None
        self._produced = 0
        # KIP-794 load statistics: a cumulative frequency table and the
        # partition ids it weighs, or None for uniform choices.
        self._load: tuple[list[int], list[int]] | None = None

    def update_load_stats(self, queue_sizes: Sequence[int], partition_ids: Sequence[int]) -> None:
        """``updatePartitionLoadStats``: the queue sizes (in batches) of the
        partitions with a leader weigh the next choice, a partition with a
        longer queue less. No weighting with fewer than two partitions or
        equal sizes."""
        if len(queue_sizes) != len(partition_ids):
            raise ValueError(f"{len(queue_sizes)} queue sizes for {len(partition_ids)} partitions")
        if len(queue_sizes) < 2 or len(set(queue_sizes)) == 1:
            self._load = None
            return
        # Invert the sizes (max + 1 - size) and fold them into a running
        # sum: a random number below the last entry maps to the first entry
        # above it, a shorter queue owning a wider range.
        top = max(queue_sizes) + 1
        table: list[int] = []
        total = 0
        for size in queue_sizes:
            total += top - size
            table.append(total)
        self._load = (table, list(partition_ids))

    def _next_partition(self, partitions: int, available: Sequence[int]) -> int:
        # BuiltInPartitioner.nextPartition: uniform over the partitions with
        # a leader, or over all when none has one.
        choice = to_positive(self._rng.getrandbits(32))
        if self._load is not None:
            table, ids = self._load
            return ids[bisect.bisect_right(table, choice % table[-1])]
        if available:
            return available[choice % len(available)]
        return choice % partitions

    def partition(self, partitions: int, available: Sequence[int]) -> int:
        """The sticky partition (chosen now if there is none yet, or if the
        topic shrank under it). ``available``: the partitions with a leader."""
        if partitions < 1:
            raise ValueError(f"topic {self.topic!r} has {partitions} partitions")
        if self._current is None or self._current >= partitions:
            self._current = self._next_partition(partitions, available)
            self._produced = 0
        return self._current

    def record_appended(
        self,
        appended_bytes: int,
        partitions: int,
        available: Sequence[int],
        *,
        enable_switch: bool = True,
    ) -> bool:
        """Count ``appended_bytes`` produced to the sticky partition and
        switch once ``batch.size`` were (``updatePartitionInfo``); with
        ``enable_switch`` false (the batch is not ready yet) only at twice
        ``batch.size``. True if it switched."""
        if self._current is None:
            raise ValueError(f"topic {self.topic!r}: no sticky partition was chosen yet")
        self._produced += appended_bytes
        if (self._produced >= self.sticky_batch_size and enable_switch) or (
            self._produced >= 2 * self.sticky_batch_size
        ):
            self._current = self._next_partition(partitions, available)
            self._produced = 0
            return True
        return False

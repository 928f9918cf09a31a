"""Which partition of the offsets topic holds a group, as Kafka places it
(``GroupCoordinatorService.partitionFor``: ``Utils.abs(groupId.hashCode())
% offsets.topic.num.partitions``), so that a group lands where a Kafka
cluster of the same partition count would put it."""

from __future__ import annotations

from metadata.image import OFFSETS_TOPIC

__all__ = ["OFFSETS_TOPIC", "java_string_hash", "partition_for"]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over the
    UTF-16 code units, in 32-bit two's complement."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """The offsets partition of ``group_id`` (``Utils.abs`` is ``n &
    0x7fffffff``, not ``abs``: Integer.MIN_VALUE maps to 0)."""
    if partitions <= 0:
        raise ValueError(f"the offsets topic's partition count {partitions} is not positive")
    return (java_string_hash(group_id) & 0x7FFFFFFF) % partitions

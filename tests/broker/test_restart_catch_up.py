"""A restarted broker loads its logs, and decides which are strays, only
against the first image that has caught up with the metadata log
(broker/replica_manager.py ``publish``: Kafka's ``MetadataLoader`` publishes
nothing before the high watermark it learned at start, and
``BrokerMetadataPublisher``'s first publish runs ``LogManager.startup``);
and a stray is set aside under a name no earlier stray of the partition
holds (broker/log_manager.py)."""

from __future__ import annotations

import pytest

from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import LogManager, LogManagerError
from broker.replica import Role
from broker.replica_manager import ReplicaManager
from metadata.image import MetadataImage, TopicIdPartition
from partition_log.batch import build_batch, decode_records, split_batches
from partition_log.log_config import LogConfig
from partition_log.records import Record
from tests.broker.images import Metadata, change, topic

A0 = TopicIdPartition("id-a", 0)
B0 = TopicIdPartition("id-b", 0)
VALUES = [b"r0", b"r1", b"r2"]


def batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1000, b"k", value)])


def at(image: MetadataImage, offset: int) -> MetadataImage:
    """The image as the broker's metadata log gives it: ending at ``offset``."""
    return image.with_provenance(offset, 1)


def images() -> tuple[MetadataImage, MetadataImage]:
    """A partial image (the brokers registered, the topic not yet created:
    what a restarted broker replays first) and the whole one."""
    md = Metadata()
    partial = at(md.image, 3)
    md.step(*topic("a", "id-a", (1, 2, 3)))
    return partial, at(md.image, 5)


def directory_with_records() -> MemoryLogDirectory:
    """Broker 1's log directory before its restart: a-0 with three records."""
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    log = logs.get_or_create(A0, "a", LogConfig(), now_ms=0)
    for value in VALUES:
        log.append_as_leader(batch(value), 0, 0)
    logs.close()
    return d


def values(manager: ReplicaManager, key: TopicIdPartition = A0) -> list[bytes]:
    data = manager.replicas[key].log.read(0, 1 << 20)
    return [r.value or b"" for b in split_batches(data) for r in decode_records(b)]


def test_a_partial_image_loads_nothing_and_the_whole_one_keeps_the_log() -> None:
    partial, whole = images()
    d = directory_with_records()
    manager = ReplicaManager(1, LogManager([d]))
    # No high watermark learned yet: nothing is published.
    assert manager.publish(partial, None, now_ms=1) is None
    # The high watermark is known, the image is behind it: still nothing,
    # and the directory of a partition the partial image does not have yet
    # is not taken for a stray.
    assert manager.publish(partial, whole.offset, now_ms=2) is None
    assert manager.loaded is None and manager.replicas == {}
    assert d.list() == ["a-0"]
    # Caught up: the logs load against the whole image, a-0 is kept.
    result = manager.publish(whole, whole.offset, now_ms=3)
    assert result is not None
    assert manager.loaded is not None
    assert (manager.loaded.loaded, manager.loaded.strays) == ((A0,), ())
    assert d.list() == ["a-0"]
    assert manager.replicas[A0].role is Role.LEADER
    assert manager.replicas[A0].log.log_end_offset == 3
    assert values(manager) == VALUES
    # Later images are applied as they come, the offset no longer matters.
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    md.step(change("id-a", 0, leader=2, isr=(2, 1, 3)))
    later = manager.publish(at(md.image, 6), whole.offset, now_ms=4)
    assert later is not None and A0 in later.changes.followers
    assert manager.replicas[A0].log.log_end_offset == 3


def test_the_first_image_at_the_high_watermark_is_caught_up() -> None:
    _, whole = images()
    manager = ReplicaManager(1, LogManager([directory_with_records()]))
    assert manager.publish(whole, whole.offset + 1, now_ms=0) is None
    assert manager.publish(whole, whole.offset, now_ms=0) is not None
    assert values(manager) == VALUES


def test_loading_the_partial_image_is_what_lost_the_log() -> None:
    """What the gate prevents: the log manager told about a partial image
    takes the partition for a stray (why only the whole image may load)."""
    partial, _ = images()
    d = directory_with_records()
    assert LogManager([d]).load(partial, 1, now_ms=0).strays == ("data/a-0.id-a-stray",)


def test_a_log_directory_that_cannot_load_raises() -> None:
    """Kafka's ``LogManager.startup`` failing: the broker process stops."""
    _, whole = images()
    d = directory_with_records()
    d.create("not-a-partition")
    manager = ReplicaManager(1, LogManager([d]))
    with pytest.raises(LogManagerError, match="'not-a-partition' is not a partition directory"):
        manager.publish(whole, whole.offset, now_ms=0)
    assert manager.loaded is None and manager.replicas == {}


def test_a_second_stray_of_a_partition_gets_a_name_of_its_own() -> None:
    """Kafka names each stray uniquely (``UnifiedLog.logStrayDirName``): a
    partition set aside again never fails on the earlier stray's name."""
    md = Metadata(*topic("a", "id-a", (1, 2)))
    d = MemoryLogDirectory("data")
    found = []
    for round_ in range(3):
        logs = LogManager([d])
        logs.get_or_create(B0, "b", LogConfig(), now_ms=0).append_as_leader(
            batch(b"%d" % round_), 0, 0
        )
        logs.close()
        found.append(LogManager([d]).load(md.image, 1, now_ms=0).strays)
    assert found == [
        ("data/b-0.id-b-stray",),
        ("data/b-0.id-b.1-stray",),
        ("data/b-0.id-b.2-stray",),
    ]
    assert d.list() == ["b-0.id-b-stray", "b-0.id-b.1-stray", "b-0.id-b.2-stray"]

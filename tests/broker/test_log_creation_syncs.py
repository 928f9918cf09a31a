"""Creating partition logs: what is synced, and that a power loss at any
point of a batch of creations leaves directories the next start loads."""

from __future__ import annotations

from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import PARTITION_METADATA_FILE, LogManager
from broker.replica_manager import ReplicaManager
from metadata.image import TopicIdPartition
from metadata.records import RemoveTopicRecord
from partition_log.batch import build_batch
from partition_log.files import MemoryDirectory
from partition_log.log import RECOVERY_POINT_FILE, PartitionLog
from partition_log.log_config import LogConfig
from partition_log.records import Record
from tests.broker.images import Metadata, topic

CONFIG = LogConfig()


class CountingLogDirectory(MemoryLogDirectory):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.syncs = 0

    def sync_directory(self) -> None:
        self.syncs += 1
        super().sync_directory()


class CountingDirectory(MemoryDirectory):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def sync_directory(self) -> None:
        self.syncs += 1
        super().sync_directory()


def keys(n: int) -> list[TopicIdPartition]:
    return [TopicIdPartition("id-t", i) for i in range(n)]


def test_a_batch_of_creations_syncs_the_log_directory_once() -> None:
    d = CountingLogDirectory("data")
    logs = LogManager([d])
    with logs.deferred_directory_syncs():
        for key in keys(50):
            logs.get_or_create(key, "t", CONFIG, now_ms=0)
        assert d.syncs == 0
    assert d.syncs == 1
    # Outside a batch each creation syncs at once.
    logs.get_or_create(TopicIdPartition("id-u", 0), "u", CONFIG, now_ms=0)
    assert d.syncs == 2


def test_a_new_log_syncs_its_directory_once_and_writes_no_recovery_point() -> None:
    directory = CountingDirectory()
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    # The first segment's creation syncs the directory; the open has nothing
    # else to sync, and a missing recovery point reads as 0.
    assert directory.syncs == 1
    assert RECOVERY_POINT_FILE not in directory.list()
    assert log.recovery_point == 0
    log.append_as_leader(build_batch([Record(0, 1000, b"k", b"v")]), 0, 0)
    log.flush(0)
    directory.crash()
    # The flushed batch survives: its segment's name was synced at creation.
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert reopened.log_end_offset == 1


def test_a_power_loss_inside_a_batch_loses_only_unsynced_new_directories() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    logs.get_or_create(TopicIdPartition("id-old", 0), "old", CONFIG, now_ms=0)
    with logs.deferred_directory_syncs():
        for key in keys(5):
            logs.get_or_create(key, "t", CONFIG, now_ms=0)
        d.crash()
    # The log directory was synced at the end of the batch, after the crash:
    # the lost directories are gone, the earlier one is whole.
    d.crash()
    assert d.list() == ["old-0"]
    meta = Metadata(*topic("old", "id-old", (1,)), *topic("t", "id-t", *[(1,)] * 5))
    restarted = LogManager([d])
    loaded = restarted.load(meta.image, 1, now_ms=0)
    assert loaded.loaded == (TopicIdPartition("id-old", 0),)
    # The next image creates them again.
    for key in keys(5):
        restarted.get_or_create(key, "t", CONFIG, now_ms=0)
    assert len(d.list()) == 6


def test_a_directory_synced_by_a_batch_keeps_its_topic_id_and_segment() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    with logs.deferred_directory_syncs():
        for key in keys(3):
            logs.get_or_create(key, "t", CONFIG, now_ms=0)
    d.crash()
    assert d.list() == ["t-0", "t-1", "t-2"]
    for name in d.list():
        files = d.open(name)
        assert PARTITION_METADATA_FILE in files.list()
        assert "00000000000000000000.log" in files.list()


def test_logs_created_ahead_are_the_ones_the_apply_serves() -> None:
    d = MemoryLogDirectory("data")
    replicas = ReplicaManager(1, LogManager([d]))
    meta = Metadata()
    replicas.publish(meta.image, meta.image.offset, 0)
    _, image = meta.step(*topic("t", "id-t", *[(1, 2)] * 4, *[(2, 1)] * 3))
    todo = replicas.logs_to_create(image)
    assert [key for key, _ in todo] == keys(7)
    assert replicas.create_logs(image, todo[:5], now_ms=0) == 5
    # Nothing serves them before the apply; only the rest are still to create.
    assert replicas.replicas == {}
    assert [key for key, _ in replicas.logs_to_create(image)] == keys(7)[5:]
    ahead = {key: replicas.logs.log(key) for key in keys(5)}
    replicas.apply_delta(image, now_ms=0)
    assert set(replicas.replicas) == set(keys(7))
    for key, log in ahead.items():
        assert replicas.replicas[key].log is log
    assert replicas.logs_to_create(image) == []


def test_a_log_that_cannot_be_created_ahead_is_left_for_the_apply() -> None:
    d = MemoryLogDirectory("data")
    replicas = ReplicaManager(1, LogManager([d]))
    meta = Metadata(*topic("t", "id-old", (1,)))
    replicas.publish(meta.image, meta.image.offset, 0)
    # The topic deleted and created again under its name: its new log cannot
    # be created before the apply deletes the old one.
    _, image = meta.step(RemoveTopicRecord("id-old"), *topic("t", "id-new", (1,)))
    todo = replicas.logs_to_create(image)
    assert replicas.create_logs(image, todo, now_ms=0) == 0
    result = replicas.apply_delta(image, now_ms=0)
    assert not result.failed
    assert set(replicas.replicas) == {TopicIdPartition("id-new", 0)}

"""Creating partition logs: what is synced, and that a power loss at any
point of a batch of creations leaves directories the next start loads."""

from __future__ import annotations

from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import PARTITION_METADATA_FILE, LogManager
from metadata.image import TopicIdPartition
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

"""The partition logs of a broker over its log directories
(broker/log_manager.py, Kafka's LogManager), on the in-memory twin and on
real directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log_dirs import MemoryLogDirectory
from broker.log_manager import (
    PARTITION_METADATA_FILE,
    LogManager,
    LogManagerError,
    TopicConfigError,
    decode_partition_metadata,
    encode_partition_metadata,
    parse_directory_name,
    replica_fetcher_config,
    topic_log_config,
    topic_min_isr,
    topic_replica_config,
)
from broker.os_log_dirs import OsLogDirectory
from broker.replica import FetcherConfig
from metadata.image import TopicIdPartition
from metadata.records import ConfigRecord
from partition_log.batch import Compression, TimestampType, build_batch
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.records import Record
from tests.broker.images import BROKER_RESOURCE, Metadata, remove, topic, topic_config

A0 = TopicIdPartition("id-a", 0)
CONFIG = LogConfig()


def batch(value: bytes) -> bytes:
    return build_batch([Record(0, 1000, b"k", value)])


def test_directory_names_are_topic_dash_partition() -> None:
    assert parse_directory_name("my-topic-12") == ("my-topic", 12)
    for bad in ("topic", "-3", "topic-", "topic-x", "topic-01", "lost+found"):
        with pytest.raises(LogManagerError, match="not a partition directory"):
            parse_directory_name(bad)


def test_partition_metadata_round_trips_and_refuses_other_bytes() -> None:
    assert decode_partition_metadata("d", encode_partition_metadata("abc")) == "abc"
    with pytest.raises(LogManagerError, match="d/partition.metadata"):
        decode_partition_metadata("d", b"version: 1\ntopic_id: abc\n")


def test_a_new_log_gets_its_directory_and_topic_id() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    log = logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    log.append_as_leader(batch(b"v"), 0, 0)
    assert d.list() == ["a-0"]
    files = d.open("a-0")
    assert PARTITION_METADATA_FILE in files.list()
    # The log's view hides the broker's file (the log refuses files it does
    # not know).
    assert PARTITION_METADATA_FILE not in log.directory.list()
    assert logs.get_or_create(A0, "a", CONFIG, now_ms=0) is log
    assert logs.location(A0) == ("data", "a-0")


def test_new_logs_go_to_the_least_loaded_directory() -> None:
    d1, d2 = MemoryLogDirectory("d1"), MemoryLogDirectory("d2")
    logs = LogManager([d1, d2])
    for i in range(4):
        logs.get_or_create(TopicIdPartition("id-a", i), "a", CONFIG, now_ms=0)
    assert d1.list() == ["a-0", "a-2"] and d2.list() == ["a-1", "a-3"]


def test_a_directory_of_another_topic_id_is_refused() -> None:
    d = MemoryLogDirectory("data")
    first = LogManager([d])
    first.get_or_create(A0, "a", CONFIG, now_ms=0)
    first.close()
    second = LogManager([d])
    with pytest.raises(LogManagerError, match="holds topic id id-a, not id-b"):
        second.get_or_create(TopicIdPartition("id-b", 0), "a", CONFIG, now_ms=0)
    # While hosted too.
    with pytest.raises(LogManagerError, match="holds topic id id-a, not id-b"):
        first_again = LogManager([d])
        first_again.get_or_create(A0, "a", CONFIG, now_ms=0)
        first_again.get_or_create(TopicIdPartition("id-b", 0), "a", CONFIG, now_ms=0)


def test_restart_loads_the_logs_and_sets_strays_aside() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)), *topic("b", "id-b", (2, 3)))
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    log = logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    for i in range(3):
        log.append_as_leader(batch(b"%d" % i), 0, 0)
    # A log of b (which broker 1 no longer holds) and a leftover deletion.
    logs.get_or_create(TopicIdPartition("id-b", 0), "b", CONFIG, now_ms=0)
    logs.close()
    d.create("c-0.old-delete")
    d.sync_directory()
    reopened = LogManager([d])
    result = reopened.load(md.image, 1, now_ms=10)
    assert result.loaded == (A0,)
    assert result.strays == ("data/b-0.id-b-stray",)
    assert result.removed == ("data/c-0.old-delete",)
    loaded = reopened.log(A0)
    assert loaded is not None and loaded.log_end_offset == 3
    assert loaded.recovery.clean
    assert d.list() == ["a-0", "b-0.id-b-stray"]


def test_restart_sets_aside_the_log_of_a_deleted_topic_recreated_meanwhile() -> None:
    md = Metadata(*topic("a", "id-a", (1, 2)))
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    logs.get_or_create(A0, "a", CONFIG, now_ms=0).append_as_leader(batch(b"old"), 0, 0)
    logs.close()
    md.step(remove("id-a"), *topic("a", "id-a2", (1, 2)))
    reopened = LogManager([d])
    result = reopened.load(md.image, 1, now_ms=0)
    assert result.loaded == () and result.strays == ("data/a-0.id-a-stray",)
    new = reopened.get_or_create(TopicIdPartition("id-a2", 0), "a", CONFIG, now_ms=0)
    assert new.log_end_offset == 0


def test_an_unclean_shutdown_is_recovered_on_load() -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    log = logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    log.append_as_leader(batch(b"kept"), 0, 0)
    log.flush(0)
    log.append_as_leader(batch(b"lost"), 0, 0)
    d.crash()
    reopened = LogManager([d])
    assert reopened.load(md.image, 1, now_ms=0).loaded == (A0,)
    loaded = reopened.log(A0)
    assert loaded is not None and not loaded.recovery.clean and loaded.log_end_offset == 1


def test_a_bad_directory_name_refuses_the_load() -> None:
    md = Metadata()
    d = MemoryLogDirectory("data")
    d.create("not_a_partition")
    with pytest.raises(LogManagerError, match="'not_a_partition' is not a partition directory"):
        LogManager([d]).load(md.image, 1, now_ms=0)


def test_delete_renames_at_once_and_removes_after_the_delay() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    config = LogConfig(file_delete_delay_ms=1000)
    logs.get_or_create(A0, "a", config, now_ms=0)
    assert logs.delete(A0, now_ms=50) == "a-0.id-a-delete"
    assert d.list() == ["a-0.id-a-delete"] and logs.log(A0) is None
    # The name is free at once: a recreated topic gets a fresh directory.
    logs.get_or_create(TopicIdPartition("id-a2", 0), "a", config, now_ms=60)
    assert not logs.maybe_remove_deleted(1049)
    assert logs.maybe_remove_deleted(1050)
    assert d.list() == ["a-0"]
    assert logs.delete(A0, now_ms=0) is None


def test_a_deletion_survives_a_power_loss_once_renamed() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    logs.delete(A0, now_ms=0)
    d.crash()
    assert d.list() == ["a-0.id-a-delete"]


def test_topic_configs_with_kafkas_precedence_and_defaults() -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    assert topic_log_config(md.image, "a", 1) == LogConfig()
    md.step(
        topic_config("a", "segment.bytes", "1048576"),
        topic_config("a", "cleanup.policy", "compact,delete"),
        topic_config("a", "message.timestamp.type", "LogAppendTime"),
        topic_config("a", "flush.messages", "1"),
        topic_config("a", "min.insync.replicas", "2"),
        ConfigRecord(BROKER_RESOURCE, "1", "log.retention.ms", "5000"),
        ConfigRecord(0, "", "log.retention.ms", "9000"),
        ConfigRecord(0, "", "replica.lag.time.max.ms", "7000"),
    )
    config = topic_log_config(md.image, "a", 1)
    assert config.segment_bytes == 1048576
    assert config.cleanup_policy == CleanupPolicy.COMPACT | CleanupPolicy.DELETE
    assert config.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert config.flush_messages == 1 and config.flush_ms is None
    # The broker's own default wins over the cluster's.
    assert config.retention_ms == 5000
    assert topic_log_config(md.image, "a", 2).retention_ms == 9000
    replica = topic_replica_config(md.image, "a", 1)
    assert replica.min_insync_replicas == 2 and replica.replica_lag_time_max_ms == 7000
    # compression.type: the producer's codec by default, else the one named.
    assert config.compression is None
    for value, codec in (("uncompressed", Compression.NONE), ("snappy", Compression.SNAPPY)):
        md.step(topic_config("a", "compression.type", value))
        assert topic_log_config(md.image, "a", 1).compression is codec


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("retention.ms", "soon", "retention.ms='soon'"),
        ("cleanup.policy", "archive", "cleanup.policy='archive'"),
        # Valid for the config, too small for a log: named all the same.
        ("segment.bytes", "20", "segment.bytes=20 cannot be used"),
        ("max.message.bytes", "10", "max.message.bytes=10 cannot be used"),
    ],
)
def test_a_bad_topic_config_is_named(key: str, value: str, message: str) -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    md.step(topic_config("a", key, value))
    with pytest.raises(TopicConfigError, match=message.replace("[", r"\[")) as caught:
        topic_log_config(md.image, "a", 1)
    assert "topic a" in str(caught.value)


def test_on_real_directories(tmp_path: Path) -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    logs = LogManager([OsLogDirectory(tmp_path)])
    log = logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    log.append_as_leader(batch(b"v"), 0, 0)
    logs.close()
    (tmp_path / "meta.properties").write_text("node.id=1\n")  # files are not partitions
    reopened = LogManager([OsLogDirectory(tmp_path)])
    assert reopened.load(md.image, 1, now_ms=0).loaded == (A0,)
    assert (tmp_path / "a-0" / PARTITION_METADATA_FILE).read_text() == (
        "version: 0\ntopic_id: id-a\n"
    )
    reopened.delete(A0, now_ms=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-0.id-a-delete", "meta.properties"]
    reopened.maybe_remove_deleted(60_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.properties"]


def test_high_watermarks_are_checkpointed_and_restored() -> None:
    md = Metadata(*topic("a", "id-a", (1,)))
    d = MemoryLogDirectory("data")
    logs = LogManager([d])
    log = logs.get_or_create(A0, "a", CONFIG, now_ms=0)
    for i in range(3):
        log.append_as_leader(batch(b"%d" % i), 0, 0)
    assert logs.checkpoint_high_watermarks() == 0
    log.maybe_increment_high_watermark(2)
    assert logs.checkpoint_high_watermarks() == 1
    assert logs.checkpoint_high_watermarks() == 0
    # The log never sees the broker's files.
    assert "replication-offset-checkpoint" in d.open("a-0").list()
    assert "replication-offset-checkpoint" not in log.directory.list()
    # A power loss keeps the checkpointed HW (written and synced).
    log.flush(0)
    d.crash()
    reopened = LogManager([d])
    reopened.load(md.image, 1, now_ms=0)
    loaded = reopened.log(A0)
    assert loaded is not None and loaded.high_watermark == 2
    # A clean shutdown checkpoints the last HW.
    loaded.maybe_increment_high_watermark(3)
    reopened.close()
    last = LogManager([d])
    last.load(md.image, 1, now_ms=0)
    final = last.log(A0)
    assert final is not None and final.high_watermark == 3


def test_tick_runs_retention_flushes_removals_and_the_cleaner() -> None:
    d = MemoryLogDirectory("data")
    logs = LogManager([d], retention_check_interval_ms=3000)
    config = LogConfig(segment_bytes=200, retention_ms=1000, file_delete_delay_ms=0)
    log = logs.get_or_create(A0, "a", config, now_ms=0)
    for i in range(6):
        log.append_as_leader(batch(b"value-%d" % i * 4), 0, 0)
    log.maybe_increment_high_watermark(log.log_end_offset)
    segments = len(log.segments)
    assert segments > 1
    flushing = logs.get_or_create(TopicIdPartition("id-f", 0), "f", LogConfig(flush_ms=500), 0)
    flushing.append_as_leader(batch(b"unsynced"), 0, 0)
    early = logs.tick(now_ms=100)
    assert early.retained == () and early.flushed == ()
    # Past retention.ms and flush.ms, but the retention check is not due
    # (every 3 s from the first tick's): flushed only.
    between = logs.tick(now_ms=2000)
    assert between.retained == () and between.flushed == (TopicIdPartition("id-f", 0),)
    assert len(log.segments) == segments
    flushing.append_as_leader(batch(b"unsynced again"), 0, 0)
    late = logs.tick(now_ms=5000)
    assert late.retained == (A0,) and late.flushed == (TopicIdPartition("id-f", 0),)
    assert len(log.segments) < segments and log.pending_deletions == []
    # A compacted log is cleaned by the tick.
    compacted = LogConfig(
        segment_bytes=200, cleanup_policy=CleanupPolicy.COMPACT, min_cleanable_dirty_ratio=0.0
    )
    other = logs.get_or_create(TopicIdPartition("id-c", 0), "c", compacted, now_ms=0)
    for i in range(8):
        other.append_as_leader(build_batch([Record(0, 1000, b"same", b"v%d" % i)]), 0, 0)
    other.maybe_increment_high_watermark(other.log_end_offset)
    size = other.size
    assert logs.tick(now_ms=6000).cleaned
    assert other.size < size
    # A deleted log's directory goes with the tick too.
    logs.delete(A0, now_ms=6000)
    assert logs.tick(now_ms=6000).removed_directories
    assert d.list() == ["c-0", "f-0"]


def test_min_isr_is_the_topics_else_the_clusters_never_the_brokers() -> None:
    """The controller's rule (getTopicEffectiveMinIsr, KAFKA-16540): broker
    and controller agree on which partitions are below min ISR."""
    md = Metadata(*topic("a", "id-a", (1, 2, 3)))
    assert topic_min_isr(md.image, "a") == 1
    # A broker's own value, as an older log may hold one: not read.
    md.step(ConfigRecord(BROKER_RESOURCE, "1", "min.insync.replicas", "3"))
    assert topic_replica_config(md.image, "a", 1).min_insync_replicas == 1
    md.step(ConfigRecord(0, "", "min.insync.replicas", "2"))
    assert topic_replica_config(md.image, "a", 1).min_insync_replicas == 2
    md.step(topic_config("a", "min.insync.replicas", "3"))
    assert topic_replica_config(md.image, "a", 1).min_insync_replicas == 3
    md.step(topic_config("a", "min.insync.replicas", None))
    assert topic_min_isr(md.image, "a") == 2
    md.step(topic_config("a", "min.insync.replicas", "0"))
    with pytest.raises(TopicConfigError, match="min.insync.replicas='0'"):
        topic_min_isr(md.image, "a")


def test_replica_fetch_max_bytes_is_the_brokers_else_the_clusters_else_kafkas() -> None:
    """``replica.fetch.max.bytes`` (KafkaConfig): the bytes a follower asks
    of each partition in one fetch, 1 MiB unless set."""
    md = Metadata(*topic("a", "id-a", (1, 2)))
    assert topic_replica_config(md.image, "a", 1).replica_fetch_max_bytes == 1 << 20
    md.step(ConfigRecord(0, "", "replica.fetch.max.bytes", "4096"))
    assert topic_replica_config(md.image, "a", 1).replica_fetch_max_bytes == 4096
    md.step(ConfigRecord(BROKER_RESOURCE, "2", "replica.fetch.max.bytes", "512"))
    assert topic_replica_config(md.image, "a", 2).replica_fetch_max_bytes == 512
    assert topic_replica_config(md.image, "a", 1).replica_fetch_max_bytes == 4096
    md.step(ConfigRecord(0, "", "replica.fetch.max.bytes", "0"))
    with pytest.raises(TopicConfigError, match="replica.fetch.max.bytes='0'"):
        topic_replica_config(md.image, "a", 1)


def test_the_fetchers_min_bytes_and_wait_are_the_brokers_else_the_clusters_else_kafkas() -> None:
    """``replica.fetch.min.bytes`` and ``replica.fetch.wait.max.ms``
    (KafkaConfig): what a follower's fetches ask the leader to wait for."""
    md = Metadata(*topic("a", "id-a", (1, 2)))
    assert replica_fetcher_config(md.image, 1) == FetcherConfig(1, 500) == FetcherConfig()
    md.step(ConfigRecord(0, "", "replica.fetch.wait.max.ms", "800"))
    md.step(ConfigRecord(BROKER_RESOURCE, "2", "replica.fetch.min.bytes", "65536"))
    md.step(ConfigRecord(BROKER_RESOURCE, "2", "replica.fetch.wait.max.ms", "1000"))
    assert replica_fetcher_config(md.image, 1) == FetcherConfig(1, 800)
    assert replica_fetcher_config(md.image, 2) == FetcherConfig(65536, 1000)
    md.step(ConfigRecord(BROKER_RESOURCE, "2", "replica.fetch.min.bytes", None))
    assert replica_fetcher_config(md.image, 2) == FetcherConfig(1, 1000)
    md.step(ConfigRecord(0, "", "replica.fetch.min.bytes", "0"))
    with pytest.raises(TopicConfigError, match="replica.fetch.min.bytes='0'"):
        replica_fetcher_config(md.image, 2)


def test_a_fetcher_config_is_checked() -> None:
    with pytest.raises(ValueError, match="min_bytes must be positive, not 0"):
        FetcherConfig(min_bytes=0)
    with pytest.raises(ValueError, match="max_wait_ms must be positive, not -1"):
        FetcherConfig(max_wait_ms=-1)

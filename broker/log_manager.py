"""The partition logs of one broker over its log directories (Kafka's
``LogManager``).

Each log directory (:class:`~broker.log_dirs.LogDirectory`) holds one
directory per partition replica, named ``<topic>-<partition>`` as Kafka names
them, with a ``partition.metadata`` file holding the topic id
(``PartitionMetadataFile``: ``version: 0`` and ``topic_id: <id>``): a topic
deleted and created again under its name has another id, and a directory
whose id is not the one asked for is refused rather than served as the new
topic's log (Kafka's ``InconsistentTopicIdException``).

- :meth:`LogManager.load` opens every partition directory at start-up against
  the first metadata image (``LogManager.startup`` with
  ``isStrayKraftReplica``): a directory of a partition this broker holds in
  the image is opened (recovery happens in :meth:`PartitionLog.open`); one
  whose topic id is gone or whose replicas no longer hold this broker is a
  stray, renamed ``-stray`` and left for the operator (KAFKA-14616); a
  directory already renamed ``-delete`` is removed.
- :meth:`LogManager.get_or_create` gives a partition's log, creating its
  directory in the log directory holding the fewest partitions
  (``LogManager.nextLogDirs``).
- :meth:`LogManager.delete` is Kafka's ``asyncDelete``: the log is closed,
  its directory renamed ``<topic>-<partition>.<topic id>-delete`` at once (so
  a topic recreated under the name gets a fresh directory) and removed
  ``file.delete.delay.ms`` later by :meth:`LogManager.maybe_remove_deleted`
  (or at the next start).
- :meth:`LogManager.checkpoint_high_watermarks` writes each changed HW to
  the partition's ``replication-offset-checkpoint`` (Kafka keeps one such
  file per log directory); a log is opened with it, so a restarted
  replica's HW does not start from zero.
- :meth:`LogManager.tick` runs the scheduled work: retention (every
  ``retention_check_interval_ms``, Kafka's ``log.retention.check.interval.ms``),
  flushes by ``flush.ms``, file removals and one cleaning of the dirtiest
  compacted log.
- :func:`topic_log_config` and :func:`topic_replica_config` build a
  partition's :class:`LogConfig` and :class:`ReplicaConfig` from the
  image's configs with Kafka's precedence (topic, broker, cluster, default),
  and :func:`replica_fetcher_config` the broker's follower fetch settings;
  a value the configs refuse is a :class:`TopicConfigError` naming the config.

The files only through the seams; time only as ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from broker.log_dirs import LogDirectory
from broker.replica.types import FetcherConfig, ReplicaConfig
from metadata.configs import LONG_MAX, ResourceType, resolve, validate
from metadata.errors import ApiError
from metadata.image import TOPIC_RESOURCE, MetadataImage, TopicIdPartition
from partition_log.batch import Compression, TimestampType
from partition_log.cleaner import LogCleaner
from partition_log.errors import PartitionLogError
from partition_log.files import FileDirectory, LogFile, Names
from partition_log.log import PartitionLog
from partition_log.log_config import CleanupPolicy, LogConfig
from partition_log.log_files import (
    TMP_SUFFIX,
    decode_offset,
    encode_offset,
    read_whole,
    write_atomically,
)

__all__ = [
    "DELETE_SUFFIX",
    "HIGH_WATERMARK_FILE",
    "PARTITION_METADATA_FILE",
    "RETENTION_CHECK_INTERVAL_MS",
    "STRAY_SUFFIX",
    "LoadResult",
    "LogTick",
    "LogManager",
    "LogManagerError",
    "TopicConfigError",
    "broker_replica_lag_ms",
    "decode_partition_metadata",
    "encode_partition_metadata",
    "parse_directory_name",
    "topic_log_config",
    "topic_min_isr",
    "replica_fetcher_config",
    "topic_replica_config",
]

PARTITION_METADATA_FILE = "partition.metadata"
# The replica's HW (Kafka's replication-offset-checkpoint, one per log
# directory there; one per partition here, as the partition log keeps its
# recovery point, so a partition directory is self-contained).
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
DELETE_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"
_METADATA_VERSION = 0
# Kafka's log.retention.check.interval.ms default (5 minutes).
RETENTION_CHECK_INTERVAL_MS = 300_000


class LogManagerError(Exception):
    """A partition directory that cannot be served: a foreign topic id, a
    name that is not ``<topic>-<partition>``, a damaged metadata file."""


class TopicConfigError(ValueError):
    """A topic config whose value the log cannot run with; the message names
    the config, the topic and the value."""


# -- partition directories -------------------------------------------------------


def directory_name(topic_name: str, partition: int) -> str:
    return f"{topic_name}-{partition}"


def parse_directory_name(name: str) -> tuple[str, int]:
    """``<topic>-<partition>`` as Kafka parses it (``UnifiedLog.parseTopicPartitionName``:
    the partition follows the last dash); anything else is refused, naming
    the directory."""
    topic, dash, number = name.rpartition("-")
    if not dash or not topic or not number.isdigit() or str(int(number)) != number:
        raise LogManagerError(
            f"directory {name!r} is not a partition directory: its name must be <topic>-<partition>"
        )
    return topic, int(number)


def encode_partition_metadata(topic_id: str) -> bytes:
    return f"version: {_METADATA_VERSION}\ntopic_id: {topic_id}\n".encode()


def decode_partition_metadata(where: str, data: bytes) -> str:
    """The topic id of a ``partition.metadata`` file; anything else is
    refused, naming the directory."""
    lines = data.decode("utf-8", errors="replace").split("\n")
    if (
        len(lines) != 3
        or lines[0] != f"version: {_METADATA_VERSION}"
        or not lines[1].startswith("topic_id: ")
        or lines[2] != ""
        or not lines[1][len("topic_id: ") :]
    ):
        raise LogManagerError(f"{where}/{PARTITION_METADATA_FILE} is not a partition metadata file")
    return lines[1][len("topic_id: ") :]


_HIDDEN = frozenset(
    {
        PARTITION_METADATA_FILE,
        PARTITION_METADATA_FILE + TMP_SUFFIX,
        HIGH_WATERMARK_FILE,
        HIGH_WATERMARK_FILE + TMP_SUFFIX,
    }
)


class _LogView:
    """A partition directory as :class:`PartitionLog` sees it: without the
    broker's ``partition.metadata`` (the log refuses files it does not know;
    the directory is the broker's, the files in it the log's)."""

    def __init__(self, inner: FileDirectory) -> None:
        self._inner = inner

    def create(self, name: str) -> LogFile:
        return self._inner.create(name)

    def open(self, name: str) -> LogFile:
        return self._inner.open(name)

    def exists(self, name: str) -> bool:
        return name not in _HIDDEN and self._inner.exists(name)

    def list(self) -> Names:
        return [n for n in self._inner.list() if n not in _HIDDEN]

    def rename(self, old: str, new: str) -> None:
        self._inner.rename(old, new)

    def delete(self, name: str) -> None:
        self._inner.delete(name)

    def sync_directory(self) -> None:
        self._inner.sync_directory()


def _write_new_file(directory: FileDirectory, name: str, data: bytes) -> None:
    """``name`` in a directory just created: temporary file, sync, rename (so
    it is never found torn), with the directory sync left to the caller."""
    temporary = name + TMP_SUFFIX
    handle = directory.create(temporary)
    try:
        handle.append(data)
        handle.sync()
    finally:
        handle.close()
    directory.rename(temporary, name)


def _read_high_watermark(directory: FileDirectory) -> int:
    if not directory.exists(HIGH_WATERMARK_FILE):
        return 0
    return decode_offset(HIGH_WATERMARK_FILE, read_whole(directory, HIGH_WATERMARK_FILE))


def _read_topic_id(directory: FileDirectory, where: str) -> str | None:
    if not directory.exists(PARTITION_METADATA_FILE):
        return None
    return decode_partition_metadata(where, read_whole(directory, PARTITION_METADATA_FILE))


# -- configs ---------------------------------------------------------------------

# The topic configs the log reads: config name -> LogConfig field.
_LOG_FIELDS: Mapping[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "max.message.bytes": "max_batch_bytes",
    "message.timestamp.type": "timestamp_type",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "cleanup_policy",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "delete.retention.ms": "delete_retention_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "compression.type": "compression",
}
# compression.type's values: "producer" keeps each producer's codec.
_COMPRESSION: Mapping[str, Compression | None] = {
    "producer": None,
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
_CONFIG_OF_FIELD = {f: name for name, f in _LOG_FIELDS.items()}


def _resolved(image: MetadataImage, topic_name: str, broker_id: int, key: str) -> str:
    """The value in force for ``key``, checked against its definition (the
    controller checks what it writes; a log never runs on a value it would
    refuse, whatever wrote the records)."""
    found = resolve(
        key,
        topic=image.config((TOPIC_RESOURCE, topic_name)),
        broker=image.config((int(ResourceType.BROKER), str(broker_id))),
        cluster=image.config((int(ResourceType.CLUSTER), "")),
    )
    try:
        return validate(ResourceType.TOPIC, topic_name, key, found.value)
    except ApiError as error:
        raise TopicConfigError(
            f"topic {topic_name}: {key}={found.value!r} (set by {found.set_by}, "
            f"{found.source.value}) is not valid: {error}"
        ) from None


def _long_or_none(value: str) -> int | None:
    # Kafka's "never" for the flush configs is Long.MAX_VALUE.
    number = int(value)
    return None if number >= LONG_MAX else number


def topic_log_config(image: MetadataImage, topic_name: str, broker_id: int) -> LogConfig:
    """The :class:`LogConfig` of ``topic_name``'s logs on ``broker_id``
    (``LogConfig.fromProps`` over the topic's overrides and the broker's and
    cluster's defaults)."""
    values = {key: _resolved(image, topic_name, broker_id, key) for key in _LOG_FIELDS}
    policy = CleanupPolicy(0)
    for item in values["cleanup.policy"].split(","):
        policy |= CleanupPolicy[item.upper()]
    kwargs = {
        "segment_bytes": int(values["segment.bytes"]),
        "segment_ms": int(values["segment.ms"]),
        "segment_index_bytes": int(values["segment.index.bytes"]),
        "index_interval_bytes": int(values["index.interval.bytes"]),
        "flush_messages": _long_or_none(values["flush.messages"]),
        "flush_ms": _long_or_none(values["flush.ms"]),
        "max_batch_bytes": int(values["max.message.bytes"]),
        "timestamp_type": TimestampType.LOG_APPEND_TIME
        if values["message.timestamp.type"] == "LogAppendTime"
        else TimestampType.CREATE_TIME,
        "retention_ms": int(values["retention.ms"]),
        "retention_bytes": int(values["retention.bytes"]),
        "cleanup_policy": policy,
        "file_delete_delay_ms": int(values["file.delete.delay.ms"]),
        "delete_retention_ms": int(values["delete.retention.ms"]),
        "min_cleanable_dirty_ratio": float(values["min.cleanable.dirty.ratio"]),
        "min_compaction_lag_ms": int(values["min.compaction.lag.ms"]),
        "max_compaction_lag_ms": int(values["max.compaction.lag.ms"]),
        "compression": _COMPRESSION[values["compression.type"]],
    }
    try:
        return LogConfig(**kwargs)  # type: ignore[arg-type]
    except ValueError:
        # LogConfig's own ranges are narrower than a few of the configs'
        # (segment.bytes must hold a batch header): name the config.
        for name, f in _LOG_FIELDS.items():
            try:
                LogConfig(**{f: kwargs[f]})  # type: ignore[arg-type]
            except ValueError as error:
                raise TopicConfigError(
                    f"topic {topic_name}: {name}={values[name]} cannot be used by a partition "
                    f"log ({error})"
                ) from None
        raise


def topic_min_isr(image: MetadataImage, topic_name: str) -> int:
    """The topic's effective ``min.insync.replicas``: its own value, else the
    cluster's, else the default (1), the rule the controller decides the
    ELR by (``ReplicationControlManager.getTopicEffectiveMinIsr``). A
    broker's own value is never read, even one an older log left (the
    controller may not write one and deletes those it finds, KAFKA-16540):
    broker and controller must agree on which partitions are below min ISR,
    or the HW could move while the controller counts the partition under
    it and elects from an ELR that misses committed records. The
    replication factor caps it in the replica (``Partition.effectiveMinIsr``)."""
    found = resolve(
        "min.insync.replicas",
        topic=image.config((TOPIC_RESOURCE, topic_name)),
        cluster=image.config((int(ResourceType.CLUSTER), "")),
    )
    try:
        return int(validate(ResourceType.TOPIC, topic_name, "min.insync.replicas", found.value))
    except ApiError as error:
        raise TopicConfigError(
            f"topic {topic_name}: min.insync.replicas={found.value!r} (set by "
            f"{found.set_by}, {found.source.value}) is not valid: {error}"
        ) from None


def topic_replica_config(image: MetadataImage, topic_name: str, broker_id: int) -> ReplicaConfig:
    """The replica's configs: the topic's effective ``min.insync.replicas``
    (:func:`topic_min_isr`) and the broker's ``replica.lag.time.max.ms`` and
    ``replica.fetch.max.bytes``."""
    min_isr = topic_min_isr(image, topic_name)
    return ReplicaConfig(
        replica_lag_time_max_ms=_broker_int(image, broker_id, "replica.lag.time.max.ms"),
        min_insync_replicas=min_isr,
        replica_fetch_max_bytes=_broker_int(image, broker_id, "replica.fetch.max.bytes"),
    )


def replica_fetcher_config(image: MetadataImage, broker_id: int) -> FetcherConfig:
    """The broker's ``replica.fetch.min.bytes`` and
    ``replica.fetch.wait.max.ms``, which its follower fetches carry (its
    own, else the cluster's, else the default)."""
    return FetcherConfig(
        min_bytes=_broker_int(image, broker_id, "replica.fetch.min.bytes"),
        max_wait_ms=_broker_int(image, broker_id, "replica.fetch.wait.max.ms"),
    )


def broker_replica_lag_ms(image: MetadataImage, broker_id: int) -> int:
    """The broker's ``replica.lag.time.max.ms`` (its own, else the
    cluster's, else the default); the default if the image holds a value
    the configs refuse."""
    try:
        return _broker_int(image, broker_id, "replica.lag.time.max.ms")
    except TopicConfigError:
        return ReplicaConfig().replica_lag_time_max_ms


def _broker_int(image: MetadataImage, broker_id: int, name: str) -> int:
    """A broker config's value for ``broker_id``: its own, else the
    cluster's, else the default."""
    found = resolve(
        name,
        broker=image.config((int(ResourceType.BROKER), str(broker_id))),
        cluster=image.config((int(ResourceType.CLUSTER), "")),
    )
    try:
        return int(validate(ResourceType.CLUSTER, "", name, found.value))
    except ApiError as error:
        raise TopicConfigError(f"{name}={found.value!r} is not valid: {error}") from None


def _stray_name(log_dir: LogDirectory, name: str, topic_id: str) -> str:
    """A free name to set ``name`` aside under: ``<name>.<topic id>-stray``,
    or with ``.1``, ``.2``... after the id when a stray of the same partition
    is already there (Kafka's ``UnifiedLog.logStrayDirName`` puts a fresh
    uuid in each stray's name, so setting a partition aside never fails on
    an earlier stray of it)."""
    stray = f"{name}.{topic_id}{STRAY_SUFFIX}"
    n = 0
    while log_dir.exists(stray):
        n += 1
        stray = f"{name}.{topic_id}.{n}{STRAY_SUFFIX}"
    return stray


# -- the manager -----------------------------------------------------------------


@dataclass(slots=True)
class _Hosted:
    log: PartitionLog
    directory: LogDirectory
    name: str
    topic_id: str
    files: FileDirectory
    # The HW last written to the checkpoint.
    checkpointed: int = 0


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What :meth:`LogManager.load` found."""

    loaded: tuple[TopicIdPartition, ...]
    # "<log directory>/<name>": directories set aside as strays, and
    # leftovers of deletions removed.
    strays: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(slots=True)
class _Deletion:
    due_ms: int
    directory: LogDirectory
    name: str


@dataclass(frozen=True, slots=True)
class LogTick:
    """What one :meth:`LogManager.tick` did."""

    retained: tuple[TopicIdPartition, ...] = ()
    flushed: tuple[TopicIdPartition, ...] = ()
    cleaned: bool = False
    removed_directories: bool = False
    # Logs whose files refused a step (KAFKA_STORAGE_ERROR), with why.
    failed: Mapping[TopicIdPartition, str] = field(default_factory=dict)


def _cleaner_name(key: TopicIdPartition) -> str:
    return f"{key.topic_id}/{key.partition}"


@dataclass
class LogManager:
    """The partition logs of one broker (``LogManager``)."""

    log_dirs: Sequence[LogDirectory]
    _logs: dict[TopicIdPartition, _Hosted] = field(default_factory=dict)
    _deletions: list[_Deletion] = field(default_factory=list)
    cleaner: LogCleaner = field(default_factory=LogCleaner)
    # Log directories with new partition directories not yet synced, while
    # deferred_directory_syncs runs.
    _deferring: bool = False
    _unsynced: list[LogDirectory] = field(default_factory=list)
    # Kafka's log.retention.check.interval.ms: retention walks every log's
    # segments, so with thousands of partitions a walk on every tick held
    # the event loop for a large part of each tick. The first tick checks.
    retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS
    _next_retention_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.log_dirs:
            raise ValueError("a log manager needs at least one log directory")
        names = [d.name for d in self.log_dirs]
        if len(set(names)) != len(names):
            raise ValueError(f"log directories listed twice: {names}")
        if self.retention_check_interval_ms <= 0:
            raise ValueError(
                f"retention_check_interval_ms must be positive, not "
                f"{self.retention_check_interval_ms}"
            )

    # -- reading ------------------------------------------------------------

    def log(self, key: TopicIdPartition) -> PartitionLog | None:
        hosted = self._logs.get(key)
        return None if hosted is None else hosted.log

    @property
    def partitions(self) -> frozenset[TopicIdPartition]:
        return frozenset(self._logs)

    def location(self, key: TopicIdPartition) -> tuple[str, str] | None:
        """(log directory, partition directory) of a hosted partition."""
        hosted = self._logs.get(key)
        return None if hosted is None else (hosted.directory.name, hosted.name)

    @property
    def pending_deletions(self) -> list[str]:
        return [f"{d.directory.name}/{d.name}" for d in self._deletions]

    # -- start-up -----------------------------------------------------------

    def load(self, image: MetadataImage, broker_id: int, now_ms: int) -> LoadResult:
        """Open every partition directory of every log directory for the
        partitions this broker holds in ``image`` (the first image after a
        start). Leftover ``-delete`` directories are removed; strays (a
        topic id the image does not have, a partition whose replicas no
        longer hold this broker, no metadata file and no such topic) are
        renamed ``-stray``. A directory name that is not a partition's, or
        two directories of one partition, refuse the load, naming them."""
        loaded: list[TopicIdPartition] = []
        strays: list[str] = []
        removed: list[str] = []
        for log_dir in self.log_dirs:
            changed = False
            for name in log_dir.list():
                where = f"{log_dir.name}/{name}"
                if name.endswith(DELETE_SUFFIX):
                    log_dir.remove(name)
                    removed.append(where)
                    changed = True
                    continue
                if name.endswith(STRAY_SUFFIX):
                    continue
                topic_name, partition = parse_directory_name(name)
                directory = log_dir.open(name)
                recorded = _read_topic_id(directory, where)
                topic = image.topic_by_name(topic_name)
                registration = topic.partition(partition) if topic is not None else None
                if (
                    topic is None
                    or registration is None
                    or broker_id not in registration.replicas
                    or (recorded is not None and recorded != topic.topic_id)
                ):
                    stray = _stray_name(log_dir, name, recorded or "unknown")
                    log_dir.rename(name, stray)
                    strays.append(f"{log_dir.name}/{stray}")
                    changed = True
                    continue
                key = TopicIdPartition(topic.topic_id, partition)
                other = self._logs.get(key)
                if other is not None:
                    raise LogManagerError(
                        f"partition {name} has a directory in both {other.directory.name} and "
                        f"{log_dir.name}"
                    )
                if recorded is None:
                    # A directory from before topic ids: it takes the image's
                    # (Partition.checkOrSetTopicId).
                    write_atomically(
                        directory, PARTITION_METADATA_FILE, encode_partition_metadata(key.topic_id)
                    )
                config = topic_log_config(image, topic_name, broker_id)
                self._open(key, log_dir, name, directory, config, now_ms)
                loaded.append(key)
            if changed:
                log_dir.sync_directory()
        return LoadResult(tuple(loaded), tuple(strays), tuple(removed))

    # -- one partition --------------------------------------------------------

    def _least_loaded(self) -> LogDirectory:
        counts = {id(d): 0 for d in self.log_dirs}
        for hosted in self._logs.values():
            counts[id(hosted.directory)] += 1
        return min(self.log_dirs, key=lambda d: counts[id(d)])

    def get_or_create(
        self, key: TopicIdPartition, topic_name: str, config: LogConfig, now_ms: int
    ) -> PartitionLog:
        """The log of ``key``, opened or created (``LogManager.getOrCreateLog``).
        A directory of this name holding another topic id is refused."""
        hosted = self._logs.get(key)
        if hosted is not None:
            return hosted.log
        name = directory_name(topic_name, key.partition)
        for other_key, other in self._logs.items():
            if other.name == name:
                raise LogManagerError(
                    f"{other.directory.name}/{name} holds topic id {other_key.topic_id}, "
                    f"not {key.topic_id}: the topic {topic_name} was deleted and created "
                    "again and the old replica is not yet deleted"
                )
        for log_dir in self.log_dirs:
            if log_dir.exists(name):
                where = f"{log_dir.name}/{name}"
                directory = log_dir.open(name)
                recorded = _read_topic_id(directory, where)
                if recorded is not None and recorded != key.topic_id:
                    raise LogManagerError(
                        f"{where} holds topic id {recorded}, not {key.topic_id} of topic "
                        f"{topic_name}: refusing to serve another topic's log"
                    )
                if recorded is None:
                    write_atomically(
                        directory, PARTITION_METADATA_FILE, encode_partition_metadata(key.topic_id)
                    )
                return self._open(key, log_dir, name, directory, config, now_ms)
        log_dir = self._least_loaded()
        directory = log_dir.create(name)
        # The id first: a directory never exists without it after the sync.
        # Its rename is made durable by the sync of the partition directory
        # that creating the log's first segment does, not by one of its own.
        _write_new_file(directory, PARTITION_METADATA_FILE, encode_partition_metadata(key.topic_id))
        log = self._open(key, log_dir, name, directory, config, now_ms)
        self._sync_log_directory(log_dir)
        return log

    def _sync_log_directory(self, log_dir: LogDirectory) -> None:
        if self._deferring:
            if all(d is not log_dir for d in self._unsynced):
                self._unsynced.append(log_dir)
        else:
            log_dir.sync_directory()

    @contextmanager
    def deferred_directory_syncs(self) -> Iterator[None]:
        """Create logs with one sync of each log directory at the end instead
        of one per log (a metadata apply creating thousands of partitions).
        A crash before the sync may lose a new partition's directory; that
        is harmless: nothing in it was acknowledged before the end of the
        apply, and the next image creates it again (Kafka's
        ``LogManager.getOrCreateLog`` does not sync the parent directory at
        creation either; ``LocalLog.flush`` syncs it with the first flush)."""
        if self._deferring:
            yield
            return
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            unsynced, self._unsynced = self._unsynced, []
            for log_dir in unsynced:
                log_dir.sync_directory()

    def _open(
        self,
        key: TopicIdPartition,
        log_dir: LogDirectory,
        name: str,
        directory: FileDirectory,
        config: LogConfig,
        now_ms: int,
    ) -> PartitionLog:
        """Open the log with the checkpointed HW (``Partition.createLog``
        reads ``highWatermarkCheckpoints``; the log clamps it into itself)."""
        high_watermark = _read_high_watermark(directory)
        log = PartitionLog.open(
            _LogView(directory), config, now_ms=now_ms, high_watermark=high_watermark
        )
        self._logs[key] = _Hosted(log, log_dir, name, key.topic_id, directory, high_watermark)
        self.cleaner.add_log(_cleaner_name(key), log)
        return log

    def tick(self, now_ms: int) -> LogTick:
        """The log manager's scheduled tasks in one step (Kafka's
        ``kafka-log-retention``, ``kafka-log-flusher``, the segment and log
        deletions and one ``LogCleaner`` cleaning): retention below the HW
        (when ``retention_check_interval_ms`` has passed since the last), a
        sync of the logs whose ``flush.ms`` has passed, the ``.deleted``
        files and ``-delete`` directories whose delay has passed, and the
        dirtiest compacted log cleaned once. A log whose files fail is
        reported and the others go on (Kafka takes its log directory
        offline)."""
        retained: list[TopicIdPartition] = []
        flushed: list[TopicIdPartition] = []
        failed: dict[TopicIdPartition, str] = {}
        retain = self._next_retention_ms is None or now_ms >= self._next_retention_ms
        if retain:
            self._next_retention_ms = now_ms + self.retention_check_interval_ms
        for key, hosted in self._logs.items():
            log = hosted.log
            try:
                if retain and log.maybe_delete_segments(now_ms):
                    retained.append(key)
                if log.maybe_flush(now_ms):
                    flushed.append(key)
                log.maybe_remove_deleted(now_ms)
            except PartitionLogError as error:
                failed[key] = str(error)
        try:
            cleaned = self.cleaner.maybe_clean(now_ms)
        except PartitionLogError:
            # The cleaner's log is left as its crash-safe swap leaves it;
            # Kafka marks the partition uncleanable and goes on.
            cleaned = False
        removed = self.maybe_remove_deleted(now_ms)
        return LogTick(tuple(sorted(retained)), tuple(sorted(flushed)), cleaned, removed, failed)

    def checkpoint_high_watermarks(self) -> int:
        """Write the HW of every log whose HW changed since its last
        checkpoint (``ReplicaManager.checkpointHighWatermarks``, every
        ``replica.high.watermark.checkpoint.interval.ms``); how many."""
        written = 0
        for hosted in self._logs.values():
            high_watermark = hosted.log.high_watermark
            if high_watermark != hosted.checkpointed:
                write_atomically(hosted.files, HIGH_WATERMARK_FILE, encode_offset(high_watermark))
                hosted.checkpointed = high_watermark
                written += 1
        return written

    def update_config(self, key: TopicIdPartition, config: LogConfig) -> None:
        """A topic config changed (``LogManager.updateTopicConfig``): the log
        reads it from its next call on."""
        hosted = self._logs.get(key)
        if hosted is not None:
            hosted.log.config = config

    def delete(self, key: TopicIdPartition, now_ms: int) -> str | None:
        """``LogManager.asyncDelete``: close the log and rename its directory
        ``<name>.<topic id>-delete`` now; the files go
        ``file.delete.delay.ms`` later. The new name, or None if not hosted."""
        hosted = self._logs.pop(key, None)
        if hosted is None:
            return None
        self.cleaner.remove_log(_cleaner_name(key))
        delay = hosted.log.config.file_delete_delay_ms
        hosted.log.close()
        target = f"{hosted.name}.{hosted.topic_id}{DELETE_SUFFIX}"
        log_dir = hosted.directory
        if log_dir.exists(target):
            log_dir.remove(target)
        log_dir.rename(hosted.name, target)
        log_dir.sync_directory()
        self._deletions.append(_Deletion(now_ms + delay, log_dir, target))
        return target

    def maybe_remove_deleted(self, now_ms: int) -> bool:
        """Remove the deleted directories whose delay has passed; whether any
        was removed."""
        due = [d for d in self._deletions if d.due_ms <= now_ms]
        if not due:
            return False
        self._deletions = [d for d in self._deletions if d.due_ms > now_ms]
        for deletion in due:
            deletion.directory.remove(deletion.name)
            deletion.directory.sync_directory()
        return True

    def close(self) -> None:
        """A clean shutdown: every log closed (``LogManager.shutdown``); their
        clean-shutdown markers make the next start skip recovery. The HWs
        are checkpointed first (``ReplicaManager.shutdown``)."""
        self.checkpoint_high_watermarks()
        hosted, self._logs = list(self._logs.values()), {}
        self.cleaner = LogCleaner()
        for h in hosted:
            h.log.close()

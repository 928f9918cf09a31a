"""Config definitions of topics, brokers and the cluster, and their validation.

The part of Kafka's ``ConfigDef``, ``LogConfig`` and ``KafkaConfig`` that a
kq broker and controller need.  Names, types, defaults and ranges are
Kafka's, so an operator's Kafka habits (and ``kafka-configs.sh`` muscle
memory) carry over.

Three kinds of resource hold configs (:class:`ResourceType`): a topic, one
broker, and the cluster (Kafka's "default broker" resource, whose name is
the empty string).  Every topic config has a broker-level synonym that sets
its default for the topics of one broker or of the whole cluster
(:data:`SYNONYMS`, e.g. ``retention.ms`` and ``log.retention.ms``); a few
share one name at both levels (``min.insync.replicas``).  The value in force
for a topic is found with Kafka's precedence (:func:`resolve`): the topic's
override, then the broker's, then the cluster's, then the static default.

Values travel and are stored as strings, as in Kafka's ``ConfigRecord``.
:func:`validate` checks one and returns it in normal form, so equal settings
are equal strings in the log (``TRUE`` is stored as ``true``).  Everything
here is pure: no I/O and no clock.
"""

from __future__ import annotations

import difflib
import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from metadata.errors import ApiError, Errors

__all__ = [
    "CONFIGS",
    "SYNONYMS",
    "ConfigDef",
    "ConfigSource",
    "ConfigType",
    "Resolved",
    "ResourceType",
    "as_bool",
    "as_float",
    "as_int",
    "as_list",
    "check_fetch_wait",
    "describe_defaults",
    "effective",
    "lookup",
    "markdown_table",
    "resolve",
    "validate",
    "validate_resource",
]


class ResourceType(enum.IntEnum):
    """What a config is set on; the number is ``ConfigRecord.resource_type``."""

    # Kafka's default broker resource (``--entity-default``): name "".
    CLUSTER = 0
    # One broker: name is its id in decimal.
    BROKER = 1
    # One topic: name is the topic's name.
    TOPIC = 2


class ConfigType(enum.Enum):
    """Kafka's ``ConfigDef.Type``, without the types kq has no use for."""

    BOOLEAN = "boolean"
    INT = "int"
    LONG = "long"
    DOUBLE = "double"
    STRING = "string"
    LIST = "list"


class ConfigSource(enum.Enum):
    """Where an effective value came from (Kafka's ``DescribeConfigs``
    ``ConfigSource``, of which kq has the dynamic ones and the default)."""

    TOPIC_CONFIG = "topic"
    DYNAMIC_BROKER_CONFIG = "broker"
    DYNAMIC_DEFAULT_BROKER_CONFIG = "cluster"
    DEFAULT_CONFIG = "default"


INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)

_TYPE_BOUNDS: Mapping[ConfigType, tuple[int, int]] = {
    ConfigType.INT: (INT_MIN, INT_MAX),
    ConfigType.LONG: (LONG_MIN, LONG_MAX),
}


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One config: its type, default and valid values.

    ``minimum``/``maximum`` bound numbers (inclusive, Kafka's ``Range``);
    ``choices`` are the allowed values of a string, or of each element of a
    list (Kafka's ``ValidString`` and ``ValidList``).  Every kq config has a
    default, so the effective value of a config is never missing."""

    name: str
    type: ConfigType
    default: str
    doc: str
    resource_types: frozenset[ResourceType]
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] | None = None

    def applies_to(self, resource_type: ResourceType) -> bool:
        return resource_type in self.resource_types


_TOPIC = frozenset({ResourceType.TOPIC})
_BROKER = frozenset({ResourceType.BROKER, ResourceType.CLUSTER})
_EVERYWHERE = frozenset(ResourceType)
_CLUSTER = frozenset({ResourceType.CLUSTER})

_defs: dict[str, ConfigDef] = {}
_synonyms: dict[str, str] = {}


def _define(
    name: str,
    type_: ConfigType,
    default: str,
    doc: str,
    resource_types: frozenset[ResourceType],
    *,
    minimum: int | float | None = None,
    maximum: int | float | None = None,
    choices: tuple[str, ...] | None = None,
) -> None:
    assert name not in _defs, name
    _defs[name] = ConfigDef(name, type_, default, doc, resource_types, minimum, maximum, choices)


def _log_config(
    name: str,
    broker_name: str,
    type_: ConfigType,
    default: str,
    doc: str,
    *,
    minimum: int | float | None = None,
    maximum: int | float | None = None,
    choices: tuple[str, ...] | None = None,
) -> None:
    """A topic config and its broker-level default (LogConfig's synonym in
    KafkaConfig); one definition when both levels share the name."""
    if broker_name == name:
        levels = [(name, doc, _EVERYWHERE)]
    else:
        broker_doc = f"Default of the topic config `{name}`, per broker or cluster-wide."
        levels = [(name, doc, _TOPIC), (broker_name, broker_doc, _BROKER)]
        _synonyms[name] = broker_name
    for level_name, level_doc, where in levels:
        _define(
            level_name,
            type_,
            default,
            level_doc,
            where,
            minimum=minimum,
            maximum=maximum,
            choices=choices,
        )


_B, _I, _L, _D, _S, _LIST = (
    ConfigType.BOOLEAN,
    ConfigType.INT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.STRING,
    ConfigType.LIST,
)
_WEEK_MS = str(7 * 24 * 60 * 60 * 1000)
_DAY_MS = str(24 * 60 * 60 * 1000)
# 1 MiB plus a record batch's log overhead (Kafka's Records.LOG_OVERHEAD).
_MAX_MESSAGE_BYTES = str(1024 * 1024 + 12)

# Topic configs (Kafka's TopicConfig and LogConfig), with their synonyms.
_log_config(
    "cleanup.policy",
    "log.cleanup.policy",
    _LIST,
    "delete",
    "What happens to old segments: delete drops them by retention time or size, compact"
    " keeps the latest record of each key; both may be listed.",
    choices=("delete", "compact"),
)
_log_config(
    "retention.ms",
    "log.retention.ms",
    _L,
    _WEEK_MS,
    "How long a segment is kept before it is deleted (delete policy); -1 keeps segments forever.",
    minimum=-1,
)
_log_config(
    "retention.bytes",
    "log.retention.bytes",
    _L,
    "-1",
    "The size a partition may grow to before its oldest segments are deleted (delete"
    " policy); -1 means no limit.",
    minimum=-1,
)
_log_config(
    "segment.bytes",
    "log.segment.bytes",
    _I,
    str(1024 * 1024 * 1024),
    "The size at which a partition's active segment is rolled.",
    # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: one record must fit.
    minimum=14,
)
_log_config(
    "segment.ms",
    "log.roll.ms",
    _L,
    _WEEK_MS,
    "The age at which a partition's active segment is rolled, even if not full, so that"
    " retention and compaction can act on it.",
    minimum=1,
)
_log_config(
    "segment.index.bytes",
    "log.index.size.max.bytes",
    _I,
    str(10 * 1024 * 1024),
    "The size of a segment's offset index, preallocated; a segment rolls when it is full.",
    # One index entry.
    minimum=4,
)
_log_config(
    "index.interval.bytes",
    "log.index.interval.bytes",
    _I,
    "4096",
    "How many bytes of records go between two entries of the offset index.",
    minimum=0,
)
_log_config(
    "min.insync.replicas",
    "min.insync.replicas",
    _I,
    "1",
    "The fewest in-sync replicas with which a write with acks=all succeeds; with fewer,"
    " such writes are refused with NOT_ENOUGH_REPLICAS.",
    minimum=1,
)
_log_config(
    "unclean.leader.election.enable",
    "unclean.leader.election.enable",
    _B,
    "false",
    "Whether a replica outside the ISR may become leader when no in-sync replica is"
    " available: the partition comes back, but committed records may be lost.",
)
_log_config(
    "max.message.bytes",
    "message.max.bytes",
    _I,
    _MAX_MESSAGE_BYTES,
    "The largest record batch a partition accepts.",
    minimum=0,
)
_log_config(
    "compression.type",
    "compression.type",
    _S,
    "producer",
    "The compression of stored batches: producer keeps the producer's, uncompressed"
    " stores them uncompressed, the others recompress.",
    choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
)
_log_config(
    "message.timestamp.type",
    "log.message.timestamp.type",
    _S,
    "CreateTime",
    "Which timestamp a record keeps: the producer's (CreateTime) or the time the leader"
    " appended it (LogAppendTime).",
    choices=("CreateTime", "LogAppendTime"),
)
_log_config(
    "flush.messages",
    "log.flush.interval.messages",
    _L,
    str(LONG_MAX),
    "Force an fsync of the log after this many records; by default the operating system"
    " decides and replication gives durability.",
    minimum=1,
)
_log_config(
    "flush.ms",
    "log.flush.interval.ms",
    _L,
    str(LONG_MAX),
    "Force an fsync of the log when its oldest unflushed record is this old.",
    minimum=0,
)
_log_config(
    "delete.retention.ms",
    "log.cleaner.delete.retention.ms",
    _L,
    _DAY_MS,
    "How long tombstones are kept in a compacted partition, so that consumers that read"
    " from the start see the deletion.",
    minimum=0,
)
_log_config(
    "min.cleanable.dirty.ratio",
    "log.cleaner.min.cleanable.ratio",
    _D,
    "0.5",
    "The share of a partition's log not yet compacted above which the cleaner compacts it.",
    minimum=0.0,
    maximum=1.0,
)
_log_config(
    "min.compaction.lag.ms",
    "log.cleaner.min.compaction.lag.ms",
    _L,
    "0",
    "The least time a record stays uncompacted.",
    minimum=0,
)
_log_config(
    "max.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms",
    _L,
    str(LONG_MAX),
    "The longest time a record may stay uncompacted.",
    minimum=1,
)
_log_config(
    "file.delete.delay.ms",
    "log.segment.delete.delay.ms",
    _L,
    "60000",
    "How long a deleted segment's files stay on disk before they are removed.",
    minimum=0,
)

# Broker configs (Kafka's KafkaConfig) with no topic-level counterpart.
_define(
    "replica.lag.time.max.ms",
    _L,
    "30000",
    "A follower that has not caught up with the leader's log end for this long is removed"
    " from the ISR.",
    _BROKER,
    minimum=1,
)
# The bytes a follower asks of each partition in one fetch; the leader
# still answers at least one whole batch past it (KafkaConfig
# replica.fetch.max.bytes, FetchRequest v3+ per-partition max bytes, KIP-74).
_define(
    "replica.fetch.max.bytes",
    _I,
    "1048576",
    "The bytes a follower fetches of each partition in one request (at least one batch is"
    " always returned, even a larger one).",
    _BROKER,
    minimum=1,
)
# How long the leader may hold a follower's fetch for replica.fetch.min.bytes
# to arrive (KafkaConfig replica.fetch.min.bytes and replica.fetch.wait.max.ms,
# the FetchRequest's MinBytes and MaxWaitMs of ReplicaFetcherThread).  Kafka
# leaves both unchecked; kq asks at least 1 of each, since a follower asking
# 0 of either is answered at once with nothing and fetches again at once.
_define(
    "replica.fetch.min.bytes",
    _I,
    "1",
    "The bytes the leader waits for (up to replica.fetch.wait.max.ms) before it answers a"
    " follower's fetch.",
    _BROKER,
    minimum=1,
)
_define(
    "replica.fetch.wait.max.ms",
    _I,
    "500",
    "The longest the leader holds a follower's fetch for replica.fetch.min.bytes; at most"
    " replica.lag.time.max.ms.",
    _BROKER,
    minimum=1,
)

# Controller-side configs: one value for the whole cluster.  (The broker
# session and heartbeat timing are static settings of the controllers,
# [controller] in their config files, as in Kafka: not dynamic configs.)
_define(
    "num.partitions",
    _I,
    "1",
    "The number of partitions of a topic created without one.",
    _CLUSTER,
    minimum=1,
)
_define(
    "default.replication.factor",
    _I,
    "1",
    "The replication factor of a topic created without one.",
    _CLUSTER,
    minimum=1,
)
_define(
    "auto.leader.rebalance.enable",
    _B,
    "true",
    "Whether the controller moves leadership back to preferred leaders when the imbalance"
    " exceeds leader.imbalance.per.broker.percentage.",
    _CLUSTER,
)
_define(
    "leader.imbalance.check.interval.seconds",
    _L,
    "300",
    "How often the controller checks for leader imbalance.",
    _CLUSTER,
    minimum=1,
)
_define(
    "leader.imbalance.per.broker.percentage",
    _I,
    "10",
    "The percentage of a broker's partitions led by another broker above which the"
    " controller rebalances leadership.",
    _CLUSTER,
    minimum=0,
    maximum=100,
)

CONFIGS: Mapping[str, ConfigDef] = MappingProxyType(dict(sorted(_defs.items())))
"""Every config, by name."""

SYNONYMS: Mapping[str, str] = MappingProxyType(dict(sorted(_synonyms.items())))
"""Topic config -> the broker-level config that sets its default, where the
names differ (configs that share one name at both levels are not listed)."""

_TOPIC_OF: Mapping[str, str] = {broker: topic for topic, broker in _synonyms.items()}

_EMPTY: Mapping[str, str] = MappingProxyType({})


# -- validation ---------------------------------------------------------------

_INT_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# Longer than any 64-bit number: refused before parsing (a huge string of
# digits costs quadratic time to convert).
_MAX_NUMBER_CHARS = 40


def _show(value: str) -> str:
    """A value quoted for a message, cut short if long."""
    return repr(value if len(value) <= 64 else value[:60] + "...")


def _kind(resource_type: ResourceType) -> str:
    return "topic" if resource_type is ResourceType.TOPIC else "broker"


def validate_resource(resource_type: ResourceType, resource_name: str) -> None:
    """Refuses a resource name that cannot name a resource of this type
    (INVALID_REQUEST): the cluster is "", a broker its id in decimal, a
    topic any non-empty name (whether the topic exists is the caller's
    question)."""
    if resource_type is ResourceType.CLUSTER:
        if resource_name != "":
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"the cluster resource's name must be empty, not {_show(resource_name)}",
            )
    elif resource_type is ResourceType.BROKER:
        # Canonical decimal only: "01" and "1" must not name two resources.
        if not re.fullmatch(r"0|[1-9][0-9]{0,9}", resource_name) or int(resource_name) > INT_MAX:
            raise ApiError(
                Errors.INVALID_REQUEST,
                f"a broker resource's name must be a broker id (an integer from 0 to {INT_MAX}"
                f" in decimal), not {_show(resource_name)}",
            )
    elif resource_type is ResourceType.TOPIC:
        if resource_name == "":
            raise ApiError(Errors.INVALID_REQUEST, "a topic resource's name must not be empty")
    else:  # pragma: no cover - the enum has no other member
        raise ApiError(Errors.INVALID_REQUEST, f"unknown resource type {resource_type!r}")


def lookup(resource_type: ResourceType, key: str) -> ConfigDef:
    """The definition of ``key`` if it may be set on this type of resource;
    INVALID_CONFIG otherwise, naming the closest known config or the right
    resource for it.  Deleting an override needs no more than this."""
    cdef = CONFIGS.get(key)
    if cdef is None:
        known = [name for name, d in CONFIGS.items() if d.applies_to(resource_type)]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ApiError(
            Errors.INVALID_CONFIG, f"unknown {_kind(resource_type)} config {_show(key)}{hint}"
        )
    if cdef.applies_to(resource_type):
        return cdef
    if resource_type is ResourceType.TOPIC:
        topic_name = _TOPIC_OF.get(key)
        if topic_name is not None:
            hint = f"; the topic config is {topic_name!r}"
        else:
            hint = "; it cannot be set per topic"
        kind = "cluster" if cdef.resource_types == _CLUSTER else "broker"
        raise ApiError(
            Errors.INVALID_CONFIG, f"{key!r} is a {kind} config, not a topic config{hint}"
        )
    if ResourceType.TOPIC in cdef.resource_types:
        broker_name = SYNONYMS.get(key, key)
        raise ApiError(
            Errors.INVALID_CONFIG,
            f"{key!r} is a topic config, not a broker config; the default for the topics of a"
            f" broker or the cluster is {broker_name!r}",
        )
    # A cluster-wide config set on one broker.
    raise ApiError(
        Errors.INVALID_CONFIG,
        f"{key!r} is a cluster-wide config: set it on the cluster resource (name ''), not on"
        " one broker",
    )


def validate(resource_type: ResourceType, resource_name: str, key: str, value: str) -> str:
    """Checks that ``key = value`` may be set on the resource and returns
    the value in normal form: surrounding spaces stripped (Kafka trims
    every value), booleans lower-case, numbers in plain decimal, lists
    without spaces.  Refuses a bad resource name with INVALID_REQUEST and
    anything else with INVALID_CONFIG, saying what is allowed."""
    validate_resource(resource_type, resource_name)
    cdef = lookup(resource_type, key)
    return _normalize(cdef, value)


def _normalize(cdef: ConfigDef, value: str) -> str:
    text = value.strip()

    def refuse(problem: str) -> ApiError:
        return ApiError(
            Errors.INVALID_CONFIG, f"invalid value {_show(value)} for {cdef.name!r}: {problem}"
        )

    if cdef.type is ConfigType.BOOLEAN:
        lowered = text.lower()
        if lowered not in ("true", "false"):
            raise refuse("must be true or false")
        return lowered
    if cdef.type in (ConfigType.INT, ConfigType.LONG):
        if len(text) > _MAX_NUMBER_CHARS or not _INT_RE.fullmatch(text):
            raise refuse(f"must be an integer ({_range_text(cdef)})")
        number = int(text)
        _check_range(cdef, number, refuse)
        return str(number)
    if cdef.type is ConfigType.DOUBLE:
        if len(text) > _MAX_NUMBER_CHARS or not _DOUBLE_RE.fullmatch(text):
            raise refuse(f"must be a number ({_range_text(cdef)})")
        real = float(text)
        if not math.isfinite(real):
            raise refuse(f"must be a finite number ({_range_text(cdef)})")
        _check_range(cdef, real, refuse)
        # -0.0 and 0.0 are one setting.
        return repr(real + 0.0)
    if cdef.type is ConfigType.STRING:
        if cdef.choices is not None and text not in cdef.choices:
            # Kafka's ValidString is case-sensitive; so is kq, with a hint.
            same = [c for c in cdef.choices if c.lower() == text.lower()]
            hint = f"; did you mean {same[0]!r}?" if same else ""
            raise refuse(f"must be one of {', '.join(cdef.choices)}{hint}")
        return text
    # A list: comma-separated, spaces around the commas ignored (Kafka's
    # ConfigDef.parseType splits on \s*,\s*).
    items = [item.strip() for item in text.split(",")] if text else []
    if not items:
        raise refuse(f"must list at least one of {', '.join(cdef.choices or ())}")
    if cdef.choices is not None:
        wrong = [item for item in items if item not in cdef.choices]
        if wrong:
            raise refuse(
                f"{_show(wrong[0])} is not one of {', '.join(cdef.choices)}"
                " (a comma-separated list of them)"
            )
    repeated = sorted({item for item in items if items.count(item) > 1})
    if repeated:
        raise refuse(f"lists {', '.join(repeated)} more than once")
    return ",".join(items)


def _check_range(cdef: ConfigDef, number: int | float, refuse: Callable[[str], ApiError]) -> None:
    low, high = cdef.minimum, cdef.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        raise refuse(f"must be {_range_text(cdef)}")
    type_bounds = _TYPE_BOUNDS.get(cdef.type)
    if type_bounds is not None and not type_bounds[0] <= number <= type_bounds[1]:
        raise refuse(f"must be {_range_text(cdef, with_type=True)}")


def _range_text(cdef: ConfigDef, *, with_type: bool = False) -> str:
    """The config's own range; with ``with_type`` (or if it has none), within
    its type's (an INT is 32 bits and a LONG 64, as in Java)."""
    low, high = cdef.minimum, cdef.maximum
    type_bounds = _TYPE_BOUNDS.get(cdef.type)
    if type_bounds is not None and (with_type or (low is None and high is None)):
        low = type_bounds[0] if low is None else max(low, type_bounds[0])
        high = type_bounds[1] if high is None else min(high, type_bounds[1])
    show = repr if cdef.type is ConfigType.DOUBLE else str
    if low is not None and high is not None:
        return f"from {show(low)} to {show(high)}"
    if low is not None:
        return f"at least {show(low)}"
    if high is not None:
        return f"at most {show(high)}"
    return "any number"


# -- effective values ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resolved:
    """The value in force for a config, and which level set it."""

    name: str
    value: str
    source: ConfigSource
    # The config whose setting supplied the value: ``name`` itself, or its
    # broker-level synonym for a topic config set on a broker or cluster.
    set_by: str


def resolve(
    key: str,
    *,
    topic: Mapping[str, str] = _EMPTY,
    broker: Mapping[str, str] = _EMPTY,
    cluster: Mapping[str, str] = _EMPTY,
) -> Resolved:
    """The value in force for ``key``, with Kafka's precedence: the topic's
    override, then the broker's dynamic config, then the cluster-wide
    (default broker) one, then the static default.  For a topic config the
    broker and cluster levels are read under its broker-level synonym
    (``retention.ms`` under ``log.retention.ms``).  A level is consulted
    only if ``key`` may be set there.  The maps hold validated values (the
    overrides of one resource each); KeyError for an unknown ``key``."""
    cdef = CONFIGS.get(key)
    if cdef is None:
        raise KeyError(f"unknown config {key!r}")
    if cdef.applies_to(ResourceType.TOPIC) and key in topic:
        return Resolved(key, topic[key], ConfigSource.TOPIC_CONFIG, key)
    level_key = SYNONYMS.get(key, key)
    level_def = CONFIGS[level_key]
    if level_def.applies_to(ResourceType.BROKER) and level_key in broker:
        return Resolved(key, broker[level_key], ConfigSource.DYNAMIC_BROKER_CONFIG, level_key)
    if level_def.applies_to(ResourceType.CLUSTER) and level_key in cluster:
        return Resolved(
            key, cluster[level_key], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, level_key
        )
    return Resolved(key, cdef.default, ConfigSource.DEFAULT_CONFIG, key)


def effective(
    key: str,
    *,
    topic: Mapping[str, str] = _EMPTY,
    broker: Mapping[str, str] = _EMPTY,
    cluster: Mapping[str, str] = _EMPTY,
) -> str:
    """Only the value of :func:`resolve`."""
    return resolve(key, topic=topic, broker=broker, cluster=cluster).value


FETCH_WAIT = "replica.fetch.wait.max.ms"
LAG_TIME = "replica.lag.time.max.ms"


def check_fetch_wait(
    label: str,
    *,
    broker: Mapping[str, str] = _EMPTY,
    cluster: Mapping[str, str] = _EMPTY,
) -> None:
    """Refuses (INVALID_CONFIG) a ``replica.fetch.wait.max.ms`` in force
    above the ``replica.lag.time.max.ms`` in force, for the broker (or the
    cluster's default, with no ``broker`` map) named by ``label``: a
    follower whose fetch the leader may hold longer than the lag time could
    be shrunk out of the ISR while it waits (KafkaConfig's validateValues,
    "replica.fetch.wait.max.ms should always be less than or equal to
    replica.lag.time.max.ms to prevent frequent changes in ISR")."""
    wait = resolve(FETCH_WAIT, broker=broker, cluster=cluster)
    lag = resolve(LAG_TIME, broker=broker, cluster=cluster)
    if int(wait.value) > int(lag.value):
        raise ApiError(
            Errors.INVALID_CONFIG,
            f"{FETCH_WAIT} {wait.value} ({_source_text(wait)}) is above {LAG_TIME} "
            f"{lag.value} ({_source_text(lag)}) for {label}: it must be at most the lag "
            "time, or a follower could leave the ISR while the leader holds its fetch",
        )


def _source_text(found: Resolved) -> str:
    return {
        ConfigSource.DYNAMIC_BROKER_CONFIG: "the broker's own",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG: "the cluster's",
    }.get(found.source, "the default")


def describe_defaults(resource_type: ResourceType) -> dict[str, str]:
    """The static default of every config that may be set on this type of
    resource, by name."""
    return {name: d.default for name, d in CONFIGS.items() if d.applies_to(resource_type)}


# -- typed getters ------------------------------------------------------------
# They read validated values; anything else is a bug, hence ValueError.


def as_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError(f"not a boolean: {value!r}")


def as_int(value: str) -> int:
    text = value.strip()
    if not _INT_RE.fullmatch(text):
        raise ValueError(f"not an integer: {value!r}")
    return int(text)


def as_float(value: str) -> float:
    text = value.strip()
    if not _DOUBLE_RE.fullmatch(text):
        raise ValueError(f"not a number: {value!r}")
    return float(text)


def as_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",")] if value.strip() else []


# -- documentation ------------------------------------------------------------

_APPLIES = {
    _TOPIC: "topic",
    _BROKER: "broker, cluster",
    _CLUSTER: "cluster",
    _EVERYWHERE: "topic, broker, cluster",
}


def _valid_values(cdef: ConfigDef) -> str:
    if cdef.type is ConfigType.BOOLEAN:
        return "true, false"
    if cdef.type is ConfigType.LIST:
        return "comma-separated: " + ", ".join(cdef.choices or ())
    if cdef.type is ConfigType.STRING:
        return ", ".join(cdef.choices) if cdef.choices is not None else "any"
    return _range_text(cdef)


def markdown_table() -> str:
    """A Markdown table of every config: topic configs first, then broker
    and cluster ones, each group by name."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| Name | Applies to | Type | Default | Valid values | Description |"]
    rows.append("| --- | --- | --- | --- | --- | --- |")
    ordered = sorted(CONFIGS.values(), key=lambda d: (not d.applies_to(ResourceType.TOPIC), d.name))
    for d in ordered:
        doc = d.doc
        synonym = SYNONYMS.get(d.name)
        if synonym is not None:
            doc += f" Broker and cluster default: `{synonym}`."
        elif d.resource_types == _EVERYWHERE:
            doc += " Set on a broker or the cluster, it is the default for their topics."
        rows.append(
            "| "
            + " | ".join(
                cell(text)
                for text in (
                    f"`{d.name}`",
                    _APPLIES[d.resource_types],
                    d.type.value,
                    f"`{d.default}`",
                    _valid_values(d),
                    doc,
                )
            )
            + " |"
        )
    return "\n".join(rows) + "\n"

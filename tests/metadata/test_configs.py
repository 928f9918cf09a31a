"""Config definitions and validation (metadata/configs.py)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.configs import (
    CONFIGS,
    SYNONYMS,
    ConfigSource,
    ConfigType,
    Resolved,
    ResourceType,
    as_bool,
    as_float,
    as_int,
    as_list,
    check_fetch_wait,
    describe_defaults,
    effective,
    lookup,
    markdown_table,
    resolve,
    validate,
    validate_resource,
)
from metadata.errors import ApiError, Errors

TOPIC, BROKER, CLUSTER = ResourceType.TOPIC, ResourceType.BROKER, ResourceType.CLUSTER


@contextlib.contextmanager
def refused(code: Errors, *fragments: str) -> Iterator[None]:
    """Expects an ApiError with ``code`` whose message holds every fragment."""
    with pytest.raises(ApiError) as info:
        yield
    assert info.value.code is code, info.value
    missing = [f for f in fragments if f not in info.value.message]
    assert not missing, f"{missing} not in {info.value.message!r}"


# -- the registry -------------------------------------------------------------

# Kafka's names, types and defaults (LogConfig, ServerLogConfigs, KafkaConfig).
KAFKA_DEFAULTS = [
    ("cleanup.policy", ConfigType.LIST, "delete"),
    ("retention.ms", ConfigType.LONG, "604800000"),
    ("retention.bytes", ConfigType.LONG, "-1"),
    ("segment.bytes", ConfigType.INT, "1073741824"),
    ("segment.ms", ConfigType.LONG, "604800000"),
    ("segment.index.bytes", ConfigType.INT, "10485760"),
    ("index.interval.bytes", ConfigType.INT, "4096"),
    ("min.insync.replicas", ConfigType.INT, "1"),
    ("unclean.leader.election.enable", ConfigType.BOOLEAN, "false"),
    ("max.message.bytes", ConfigType.INT, "1048588"),
    ("compression.type", ConfigType.STRING, "producer"),
    ("message.timestamp.type", ConfigType.STRING, "CreateTime"),
    ("flush.messages", ConfigType.LONG, "9223372036854775807"),
    ("flush.ms", ConfigType.LONG, "9223372036854775807"),
    ("delete.retention.ms", ConfigType.LONG, "86400000"),
    ("min.cleanable.dirty.ratio", ConfigType.DOUBLE, "0.5"),
    ("min.compaction.lag.ms", ConfigType.LONG, "0"),
    ("max.compaction.lag.ms", ConfigType.LONG, "9223372036854775807"),
    ("file.delete.delay.ms", ConfigType.LONG, "60000"),
    ("log.retention.ms", ConfigType.LONG, "604800000"),
    ("log.retention.bytes", ConfigType.LONG, "-1"),
    ("log.segment.bytes", ConfigType.INT, "1073741824"),
    ("message.max.bytes", ConfigType.INT, "1048588"),
    ("num.partitions", ConfigType.INT, "1"),
    ("default.replication.factor", ConfigType.INT, "1"),
    ("auto.leader.rebalance.enable", ConfigType.BOOLEAN, "true"),
    ("leader.imbalance.check.interval.seconds", ConfigType.LONG, "300"),
    ("leader.imbalance.per.broker.percentage", ConfigType.INT, "10"),
    ("replica.lag.time.max.ms", ConfigType.LONG, "30000"),
    ("replica.fetch.max.bytes", ConfigType.INT, "1048576"),
    ("replica.fetch.min.bytes", ConfigType.INT, "1"),
    ("replica.fetch.wait.max.ms", ConfigType.INT, "500"),
]


@pytest.mark.parametrize(("name", "type_", "default"), KAFKA_DEFAULTS)
def test_kafka_names_types_and_defaults(name: str, type_: ConfigType, default: str) -> None:
    cdef = CONFIGS[name]
    assert (cdef.name, cdef.type, cdef.default) == (name, type_, default)
    assert cdef.doc


def test_where_configs_apply() -> None:
    assert CONFIGS["retention.ms"].resource_types == {TOPIC}
    assert CONFIGS["log.retention.ms"].resource_types == {BROKER, CLUSTER}
    # Kafka uses one name at both levels for these.
    for name in ("min.insync.replicas", "unclean.leader.election.enable", "compression.type"):
        assert CONFIGS[name].resource_types == {TOPIC, BROKER, CLUSTER}
    assert CONFIGS["replica.lag.time.max.ms"].resource_types == {BROKER, CLUSTER}
    # The controller's settings hold for the whole cluster.
    for name in ("num.partitions", "default.replication.factor", "auto.leader.rebalance.enable"):
        assert CONFIGS[name].resource_types == {CLUSTER}


def test_synonyms_pair_a_topic_config_with_its_broker_default() -> None:
    assert SYNONYMS["retention.ms"] == "log.retention.ms"
    assert SYNONYMS["segment.ms"] == "log.roll.ms"
    assert SYNONYMS["max.message.bytes"] == "message.max.bytes"
    assert SYNONYMS["segment.index.bytes"] == "log.index.size.max.bytes"
    assert "min.insync.replicas" not in SYNONYMS
    for topic_name, broker_name in SYNONYMS.items():
        topic_def, broker_def = CONFIGS[topic_name], CONFIGS[broker_name]
        assert topic_def.resource_types == {TOPIC}
        assert broker_def.resource_types == {BROKER, CLUSTER}
        assert (topic_def.type, topic_def.default, topic_def.minimum, topic_def.maximum) == (
            broker_def.type,
            broker_def.default,
            broker_def.minimum,
            broker_def.maximum,
        )
        assert topic_def.choices == broker_def.choices
    # Every topic config has a default at the broker and cluster levels.
    for name, cdef in CONFIGS.items():
        if cdef.resource_types == {TOPIC}:
            assert name in SYNONYMS


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_default_is_valid_and_normal(name: str) -> None:
    cdef = CONFIGS[name]
    for resource_type in cdef.resource_types:
        resource = {TOPIC: "t", BROKER: "1", CLUSTER: ""}[resource_type]
        assert validate(resource_type, resource, name, cdef.default) == cdef.default


def test_ranges() -> None:
    assert (CONFIGS["retention.ms"].minimum, CONFIGS["retention.ms"].maximum) == (-1, None)
    assert CONFIGS["segment.bytes"].minimum == 14
    assert CONFIGS["min.insync.replicas"].minimum == 1
    ratio = CONFIGS["min.cleanable.dirty.ratio"]
    assert (ratio.minimum, ratio.maximum) == (0.0, 1.0)
    assert CONFIGS["cleanup.policy"].choices == ("delete", "compact")
    assert CONFIGS["compression.type"].choices == (
        "uncompressed",
        "zstd",
        "lz4",
        "snappy",
        "gzip",
        "producer",
    )
    assert CONFIGS["message.timestamp.type"].choices == ("CreateTime", "LogAppendTime")
    assert CONFIGS["leader.imbalance.per.broker.percentage"].maximum == 100


# -- normal forms ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource_type", "name", "key", "value", "normal"),
    [
        (TOPIC, "t", "unclean.leader.election.enable", "TRUE", "true"),
        (TOPIC, "t", "unclean.leader.election.enable", " False ", "false"),
        (TOPIC, "t", "retention.ms", " 86400000 ", "86400000"),
        (TOPIC, "t", "retention.ms", "+007", "7"),
        (TOPIC, "t", "retention.ms", "-1", "-1"),
        (TOPIC, "t", "retention.ms", "-0", "0"),
        (TOPIC, "t", "retention.ms", "9223372036854775807", "9223372036854775807"),
        (TOPIC, "t", "segment.bytes", "14", "14"),
        (TOPIC, "t", "segment.bytes", "2147483647", "2147483647"),
        (TOPIC, "t", "cleanup.policy", "compact , delete", "compact,delete"),
        (TOPIC, "t", "cleanup.policy", " compact", "compact"),
        (TOPIC, "t", "min.cleanable.dirty.ratio", "5e-1", "0.5"),
        (TOPIC, "t", "min.cleanable.dirty.ratio", "1", "1.0"),
        (TOPIC, "t", "min.cleanable.dirty.ratio", ".25", "0.25"),
        (TOPIC, "t", "min.cleanable.dirty.ratio", "-0.0", "0.0"),
        (TOPIC, "t", "compression.type", " zstd ", "zstd"),
        (TOPIC, "t", "message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        (BROKER, "0", "log.retention.ms", "1000", "1000"),
        (BROKER, "2147483647", "min.insync.replicas", "2", "2"),
        (CLUSTER, "", "num.partitions", "12", "12"),
        (CLUSTER, "", "leader.imbalance.per.broker.percentage", "100", "100"),
        (CLUSTER, "", "auto.leader.rebalance.enable", "tRuE", "true"),
    ],
)
def test_validate_returns_the_normal_form(
    resource_type: ResourceType, name: str, key: str, value: str, normal: str
) -> None:
    assert validate(resource_type, name, key, value) == normal
    # The normal form is a fixed point.
    assert validate(resource_type, name, key, normal) == normal


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-1, max_value=2**63 - 1), st.sampled_from(["", "+", " "]))
def test_any_long_in_range_is_accepted(number: int, prefix: str) -> None:
    text = prefix + str(number) if number >= 0 else str(number)
    assert validate(TOPIC, "t", "retention.ms", text) == str(number)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(n for n, d in CONFIGS.items() if TOPIC in d.resource_types)),
    st.text(max_size=12) | st.integers().map(str) | st.floats().map(str),
)
def test_validated_values_are_fixed_points(key: str, value: str) -> None:
    try:
        normal = validate(TOPIC, "t", key, value)
    except ApiError as e:
        assert e.code is Errors.INVALID_CONFIG
        assert key in e.message
        return
    assert validate(TOPIC, "t", key, normal) == normal
    assert normal == normal.strip()


# -- refusals -----------------------------------------------------------------


def test_unknown_key_suggests_the_closest_name() -> None:
    with refused(
        Errors.INVALID_CONFIG, "unknown topic config 'retension.ms'", "did you mean 'retention.ms'?"
    ):
        validate(TOPIC, "t", "retension.ms", "1")
    # On a broker the suggestion is among broker configs.
    with refused(
        Errors.INVALID_CONFIG,
        "unknown broker config 'log.retension.ms'",
        "did you mean 'log.retention.ms'?",
    ):
        validate(BROKER, "1", "log.retension.ms", "1")
    with refused(
        Errors.INVALID_CONFIG, "unknown broker config 'num.partition'", "'num.partitions'"
    ):
        validate(CLUSTER, "", "num.partition", "1")


def test_unknown_key_without_a_close_name() -> None:
    with pytest.raises(ApiError) as info:
        validate(TOPIC, "t", "zzzzqqq", "1")
    assert info.value.code is Errors.INVALID_CONFIG
    assert info.value.message == "unknown topic config 'zzzzqqq'"


def test_long_keys_and_values_are_cut_short_in_messages() -> None:
    with pytest.raises(ApiError) as info:
        validate(TOPIC, "t", "x" * 10_000, "1")
    assert len(info.value.message) < 200
    assert "..." in info.value.message
    with pytest.raises(ApiError) as info:
        validate(TOPIC, "t", "compression.type", "y" * 10_000)
    assert len(info.value.message) < 300


def test_topic_config_on_a_broker_names_the_broker_synonym() -> None:
    with refused(
        Errors.INVALID_CONFIG,
        "'retention.ms' is a topic config, not a broker config",
        "'log.retention.ms'",
    ):
        validate(BROKER, "1", "retention.ms", "1000")
    with refused(Errors.INVALID_CONFIG, "'segment.ms' is a topic config", "'log.roll.ms'"):
        validate(CLUSTER, "", "segment.ms", "1000")


def test_broker_config_on_a_topic_names_the_topic_config() -> None:
    with refused(
        Errors.INVALID_CONFIG,
        "'log.retention.ms' is a broker config, not a topic config",
        "the topic config is 'retention.ms'",
    ):
        validate(TOPIC, "t", "log.retention.ms", "1000")
    with refused(
        Errors.INVALID_CONFIG,
        "'replica.lag.time.max.ms' is a broker config, not a topic config",
        "cannot be set per topic",
    ):
        validate(TOPIC, "t", "replica.lag.time.max.ms", "1000")
    with refused(
        Errors.INVALID_CONFIG,
        "'num.partitions' is a cluster config, not a topic config",
        "cannot be set per topic",
    ):
        validate(TOPIC, "t", "num.partitions", "3")


def test_cluster_config_on_one_broker() -> None:
    with refused(
        Errors.INVALID_CONFIG,
        "'num.partitions' is a cluster-wide config",
        "set it on the cluster resource",
    ):
        validate(BROKER, "1", "num.partitions", "3")


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        ("retention.ms", "abc", ["'abc'", "'retention.ms'", "must be an integer", "at least -1"]),
        ("retention.ms", "1.5", ["'1.5'", "must be an integer"]),
        ("retention.ms", "", ["''", "must be an integer"]),
        ("retention.ms", "1_000", ["'1_000'", "must be an integer"]),
        ("retention.ms", "0x10", ["'0x10'", "must be an integer"]),
        ("retention.ms", "-2", ["'-2'", "'retention.ms'", "must be at least -1"]),
        (
            "retention.ms",
            "9223372036854775808",
            ["'9223372036854775808'", "must be from -1 to 9223372036854775807"],
        ),
        ("retention.ms", "9" * 5000, ["'retention.ms'", "must be an integer"]),
        ("segment.bytes", "13", ["'13'", "'segment.bytes'", "must be at least 14"]),
        ("segment.bytes", "2147483648", ["'2147483648'", "must be from 14 to 2147483647"]),
        ("min.insync.replicas", "0", ["'0'", "'min.insync.replicas'", "must be at least 1"]),
        ("unclean.leader.election.enable", "yes", ["'yes'", "must be true or false"]),
        ("unclean.leader.election.enable", "1", ["'1'", "must be true or false"]),
        (
            "min.cleanable.dirty.ratio",
            "1.5",
            ["'1.5'", "'min.cleanable.dirty.ratio'", "must be from 0.0 to 1.0"],
        ),
        ("min.cleanable.dirty.ratio", "-0.1", ["must be from 0.0 to 1.0"]),
        ("min.cleanable.dirty.ratio", "nan", ["'nan'", "must be a number (from 0.0 to 1.0)"]),
        ("min.cleanable.dirty.ratio", "inf", ["'inf'", "must be a number"]),
        ("min.cleanable.dirty.ratio", "1e999", ["must be a finite number"]),
        ("min.cleanable.dirty.ratio", "half", ["'half'", "must be a number"]),
        (
            "compression.type",
            "brotli",
            ["'brotli'", "must be one of uncompressed, zstd, lz4, snappy, gzip, producer"],
        ),
        ("compression.type", "ZSTD", ["'ZSTD'", "must be one of", "did you mean 'zstd'?"]),
        (
            "message.timestamp.type",
            "createtime",
            ["must be one of CreateTime, LogAppendTime", "did you mean 'CreateTime'?"],
        ),
        ("cleanup.policy", "", ["''", "must list at least one of delete, compact"]),
        ("cleanup.policy", " ", ["must list at least one of delete, compact"]),
        (
            "cleanup.policy",
            "delete,remove",
            ["'delete,remove'", "'remove' is not one of delete, compact"],
        ),
        ("cleanup.policy", "delete,", ["'' is not one of delete, compact"]),
        ("cleanup.policy", "delete, delete", ["lists delete more than once"]),
    ],
)
def test_bad_values_are_refused(key: str, value: str, fragments: list[str]) -> None:
    with refused(Errors.INVALID_CONFIG, *fragments):
        validate(TOPIC, "t", key, value)


def test_compression_hint_only_for_a_case_mismatch() -> None:
    with pytest.raises(ApiError) as info:
        validate(TOPIC, "t", "compression.type", "brotli")
    assert "did you mean" not in info.value.message


def test_cluster_range_bounds() -> None:
    with refused(Errors.INVALID_CONFIG, "'101'", "must be from 0 to 100"):
        validate(CLUSTER, "", "leader.imbalance.per.broker.percentage", "101")
    with refused(Errors.INVALID_CONFIG, "'0'", "'num.partitions'", "must be at least 1"):
        validate(CLUSTER, "", "num.partitions", "0")


@pytest.mark.parametrize(
    ("resource_type", "name", "fragments"),
    [
        (CLUSTER, "1", ["the cluster resource's name must be empty, not '1'"]),
        (BROKER, "", ["a broker resource's name must be a broker id", "not ''"]),
        (BROKER, "-1", ["not '-1'"]),
        (BROKER, "01", ["not '01'"]),
        (BROKER, "one", ["not 'one'"]),
        (BROKER, " 1", ["not ' 1'"]),
        (BROKER, "2147483648", ["from 0 to 2147483647", "not '2147483648'"]),
        (TOPIC, "", ["a topic resource's name must not be empty"]),
    ],
)
def test_bad_resource_names(resource_type: ResourceType, name: str, fragments: list[str]) -> None:
    with refused(Errors.INVALID_REQUEST, *fragments):
        validate_resource(resource_type, name)
    # validate checks the resource before the config.
    key = "min.insync.replicas"
    with refused(Errors.INVALID_REQUEST, *fragments):
        validate(resource_type, name, key, "1")


def test_lookup_is_enough_for_a_deletion() -> None:
    assert lookup(TOPIC, "retention.ms") is CONFIGS["retention.ms"]
    with refused(Errors.INVALID_CONFIG, "unknown topic config 'nope'"):
        lookup(TOPIC, "nope")
    with refused(Errors.INVALID_CONFIG, "'retention.ms' is a topic config"):
        lookup(BROKER, "retention.ms")


# -- effective values ---------------------------------------------------------


def test_resolve_precedence_for_a_topic_config() -> None:
    topic = {"retention.ms": "1"}
    broker = {"log.retention.ms": "2", "retention.ms": "ignored"}
    cluster = {"log.retention.ms": "3"}
    assert resolve("retention.ms", topic=topic, broker=broker, cluster=cluster) == Resolved(
        "retention.ms", "1", ConfigSource.TOPIC_CONFIG, "retention.ms"
    )
    assert resolve("retention.ms", broker=broker, cluster=cluster) == Resolved(
        "retention.ms", "2", ConfigSource.DYNAMIC_BROKER_CONFIG, "log.retention.ms"
    )
    assert resolve("retention.ms", cluster=cluster) == Resolved(
        "retention.ms", "3", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, "log.retention.ms"
    )
    assert resolve("retention.ms") == Resolved(
        "retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG, "retention.ms"
    )
    # The topic name at broker level is not the synonym: not consulted.
    assert effective("retention.ms", broker={"retention.ms": "5"}) == "604800000"


def test_resolve_for_configs_with_one_name_at_every_level() -> None:
    assert effective("min.insync.replicas", cluster={"min.insync.replicas": "2"}) == "2"
    assert (
        effective(
            "min.insync.replicas",
            topic={"min.insync.replicas": "3"},
            cluster={"min.insync.replicas": "2"},
        )
        == "3"
    )
    resolved = resolve(
        "unclean.leader.election.enable", broker={"unclean.leader.election.enable": "true"}
    )
    assert (resolved.value, resolved.source) == ("true", ConfigSource.DYNAMIC_BROKER_CONFIG)


def test_resolve_for_broker_and_cluster_configs() -> None:
    # A broker config asked for directly: broker over cluster over default.
    assert effective("log.retention.ms", broker={"log.retention.ms": "2"}) == "2"
    assert effective("log.retention.ms", cluster={"log.retention.ms": "3"}) == "3"
    # Topic overrides do not apply to broker-level names.
    assert effective("log.retention.ms", topic={"log.retention.ms": "1"}) == "604800000"
    # A cluster-only config ignores a (mistaken) per-broker value.
    assert effective("num.partitions", broker={"num.partitions": "7"}) == "1"
    assert resolve("num.partitions", cluster={"num.partitions": "7"}) == Resolved(
        "num.partitions", "7", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, "num.partitions"
    )


def test_resolve_unknown_key() -> None:
    with pytest.raises(KeyError, match="retension.ms"):
        resolve("retension.ms")


def test_describe_defaults() -> None:
    topic = describe_defaults(TOPIC)
    assert topic["retention.ms"] == "604800000"
    assert topic["cleanup.policy"] == "delete"
    assert topic["min.insync.replicas"] == "1"
    assert "log.retention.ms" not in topic
    assert "num.partitions" not in topic
    broker = describe_defaults(BROKER)
    assert broker["log.retention.ms"] == "604800000"
    assert broker["replica.lag.time.max.ms"] == "30000"
    assert "retention.ms" not in broker
    assert "num.partitions" not in broker
    cluster = describe_defaults(CLUSTER)
    assert cluster["num.partitions"] == "1"
    assert cluster["leader.imbalance.per.broker.percentage"] == "10"
    # Session timing is a static controller setting, not a dynamic config.
    assert "broker.session.timeout.ms" not in cluster
    assert set(broker) < set(cluster)
    assert set(topic) | set(cluster) == set(CONFIGS)


# -- typed getters ------------------------------------------------------------


def test_typed_getters() -> None:
    assert as_bool("true") is True
    assert as_bool("False") is False
    assert as_int("-1") == -1
    assert as_int("9223372036854775807") == 2**63 - 1
    assert as_float("0.5") == 0.5
    assert as_list("compact,delete") == ["compact", "delete"]
    assert as_list("compact, delete") == ["compact", "delete"]
    assert as_list("") == []
    assert as_int(effective("segment.bytes")) == 1024**3
    assert as_bool(effective("auto.leader.rebalance.enable")) is True


@pytest.mark.parametrize(
    ("getter", "value", "message"),
    [
        (as_bool, "yes", "not a boolean: 'yes'"),
        (as_int, "1.0", "not an integer: '1.0'"),
        (as_int, "", "not an integer: ''"),
        (as_float, "nan", "not a number: 'nan'"),
    ],
)
def test_typed_getters_refuse_what_validation_would(
    getter: Callable[[str], object], value: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        getter(value)


# -- the follower fetch wait and the lag time ---------------------------------


def test_the_fetch_wait_may_not_exceed_the_lag_time() -> None:
    """KafkaConfig: replica.fetch.wait.max.ms <= replica.lag.time.max.ms."""
    check_fetch_wait("broker 1")  # the defaults, 500 and 30000
    check_fetch_wait("broker 1", cluster={"replica.lag.time.max.ms": "500"})  # equal is fine
    with refused(
        Errors.INVALID_CONFIG,
        "replica.fetch.wait.max.ms 500 (the default) is above replica.lag.time.max.ms 499 "
        "(the cluster's) for broker 1",
    ):
        check_fetch_wait("broker 1", cluster={"replica.lag.time.max.ms": "499"})
    # The broker's own values come before the cluster's.
    with refused(Errors.INVALID_CONFIG, "1000 (the broker's own)", "900 (the cluster's)"):
        check_fetch_wait(
            "broker 2",
            broker={"replica.fetch.wait.max.ms": "1000"},
            cluster={"replica.lag.time.max.ms": "900", "replica.fetch.wait.max.ms": "10"},
        )
    check_fetch_wait(
        "broker 2",
        broker={"replica.fetch.wait.max.ms": "1000", "replica.lag.time.max.ms": "1500"},
        cluster={"replica.lag.time.max.ms": "900"},
    )


def test_fetch_min_bytes_and_wait_are_broker_configs_of_at_least_one() -> None:
    for name in ("replica.fetch.min.bytes", "replica.fetch.wait.max.ms"):
        assert CONFIGS[name].resource_types == {BROKER, CLUSTER}
        assert validate(BROKER, "1", name, " 65536 ") == "65536"
        with refused(Errors.INVALID_CONFIG, name, "at least 1"):
            validate(CLUSTER, "", name, "0")
        with refused(Errors.INVALID_CONFIG, "not a topic config"):
            validate(TOPIC, "t", name, "1")


# -- documentation ------------------------------------------------------------


def test_markdown_table() -> None:
    table = markdown_table()
    lines = table.splitlines()
    assert lines[0] == "| Name | Applies to | Type | Default | Valid values | Description |"
    assert lines[1] == "| --- | --- | --- | --- | --- | --- |"
    rows = lines[2:]
    assert len(rows) == len(CONFIGS)
    names = [row.split(" | ")[0].removeprefix("| ").strip("`") for row in rows]
    assert sorted(names) == sorted(CONFIGS)
    # Topic configs first.
    first_broker_only = names.index("auto.leader.rebalance.enable")
    assert all(TOPIC in CONFIGS[n].resource_types for n in names[:first_broker_only])
    assert all(TOPIC not in CONFIGS[n].resource_types for n in names[first_broker_only:])
    for row in rows:
        # Six cells: seven unescaped pipes.
        assert len(re.findall(r"(?<!\\)\|", row)) == 7, row
    by_name = dict(zip(names, rows, strict=True))
    assert by_name["retention.ms"].startswith(
        "| `retention.ms` | topic | long | `604800000` | at least -1 | "
    )
    assert "`log.retention.ms`" in by_name["retention.ms"]
    assert by_name["min.cleanable.dirty.ratio"].split(" | ")[4] == "from 0.0 to 1.0"
    assert by_name["cleanup.policy"].split(" | ")[4] == "comma-separated: delete, compact"
    assert by_name["num.partitions"].split(" | ")[1] == "cluster"
    assert by_name["min.insync.replicas"].split(" | ")[1] == "topic, broker, cluster"
    assert by_name["log.retention.ms"].split(" | ")[1] == "broker, cluster"
    assert table.endswith("\n")

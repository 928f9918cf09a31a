"""The metadata admin commands (kq topics, configs, brokers, leader-election,
reassign, features): argument checks, output from canned answers, exit
statuses.  The client's methods are replaced; nothing is sent."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kq.cli import main
from kqproto import metadata_pb2
from metadata.client import (
    ConfigOp,
    ConfigResource,
    IndeterminateError,
    MetadataClient,
    MetadataClientError,
    NewPartitions,
    NewTopic,
    NoControllerError,
    Reassignment,
    TopicPartition,
)
from metadata.errors import Errors
from tests.driver.cluster_util import free_ports
from tests.metadata.fake_controllers import FakeController, two_controllers

B = ["--bootstrap", "127.0.0.1:1"]
Calls = list[tuple[tuple[Any, ...], dict[str, Any]]]


def fake(monkeypatch: pytest.MonkeyPatch, name: str, result: Any) -> Calls:
    """Replace MetadataClient.<name>: it records its arguments and returns
    ``result`` (or raises it; a list gives one answer per call)."""
    calls: Calls = []
    answers = list(result) if isinstance(result, list) else None

    async def method(self: MetadataClient, *args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        answer = answers.pop(0) if answers is not None else result
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(MetadataClient, name, method)
    return calls


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv``, which must fail as bad usage (exit 2); return stderr."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = int(exc.code or 0)
    assert status == 2
    return capsys.readouterr().err


def partition(
    index: int,
    leader: int,
    replicas: list[int],
    isr: list[int],
    adding: list[int] | None = None,
    removing: list[int] | None = None,
    elr: list[int] | None = None,
    last_known_elr: list[int] | None = None,
    offline: list[int] | None = None,
) -> metadata_pb2.PartitionDescription:
    return metadata_pb2.PartitionDescription(
        partition=index,
        leader=leader,
        leader_epoch=3,
        partition_epoch=7,
        replicas=replicas,
        isr=isr,
        adding_replicas=adding or [],
        removing_replicas=removing or [],
        eligible_leader_replicas=elr or [],
        last_known_elr=last_known_elr or [],
        offline_replicas=offline or [],
    )


def topics_response() -> metadata_pb2.DescribeTopicsResponse:
    return metadata_pb2.DescribeTopicsResponse(
        topics=[
            metadata_pb2.TopicDescription(
                name="foo",
                topic_id="AAAAAAAAAAAAAAAAAAAAAQ",
                partitions=[
                    partition(1, -1, [2, 3, 1], [], elr=[2, 3], last_known_elr=[1]),
                    partition(0, 1, [1, 2, 3], [1, 2, 3]),
                    partition(2, 3, [3, 1, 2, 4], [3, 1, 2], adding=[4], removing=[2]),
                ],
                configs={"retention.ms": "1000", "cleanup.policy": "compact"},
            ),
        ],
        metadata_offset=99,
    )


# -- kq topics -------------------------------------------------------------------


def test_topics_create(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    result = metadata_pb2.CreateTopicsResponse(
        topics=[
            metadata_pb2.CreatableTopicResult(
                name="foo", topic_id="id1", num_partitions=3, replication_factor=2
            )
        ]
    )
    calls = fake(monkeypatch, "create_topics", result)
    argv = ["topics", "create", "foo", "--partitions", "3", "--replication-factor", "2"]
    assert main([*argv, "--config", "retention.ms=1000", "--config", "a.b=x=y", *B]) == 0
    assert capsys.readouterr().out == "Created topic foo.\n"
    (topics,), kwargs = calls[0]
    assert topics == [
        NewTopic("foo", 3, 2, configs={"retention.ms": "1000", "a.b": "x=y"}, assignments={})
    ]
    assert kwargs == {"validate_only": False}
    assert main(["topics", "create", "foo", "--replica-assignment", "1:2,2:3", *B, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["topic_id"] == "id1" and out["error"] == "NONE"
    assert calls[1][0][0][0] == NewTopic("foo", -1, -1, assignments={0: [1, 2], 1: [2, 3]})
    assert main(["topics", "create", "foo", "--validate-only", *B]) == 0
    assert "nothing was created" in capsys.readouterr().out
    assert calls[2][1] == {"validate_only": True}


def test_topics_create_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exists = metadata_pb2.CreateTopicsResponse(
        topics=[
            metadata_pb2.CreatableTopicResult(
                name="foo",
                error=metadata_pb2.TOPIC_ALREADY_EXISTS,
                message="topic foo already exists",
            )
        ]
    )
    fake(monkeypatch, "create_topics", exists)
    assert main(["topics", "create", "foo", *B]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "TOPIC_ALREADY_EXISTS: topic foo already exists" in captured.err
    assert main(["topics", "create", "foo", "--if-not-exists", *B]) == 0
    assert capsys.readouterr().err == ""
    assert main(["topics", "create", "foo", *B, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "TOPIC_ALREADY_EXISTS"


def test_topics_create_bad_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake(monkeypatch, "create_topics", metadata_pb2.CreateTopicsResponse())
    base = ["topics", "create", "foo", *B]
    assert "config 'retention.ms' is not key=value" in usage_error(
        capsys, [*base, "--config", "retention.ms"]
    )
    assert "--config a is given twice" in usage_error(
        capsys, [*base, "--config", "a=1", "--config", "a=2"]
    )
    assert "'x' is not an integer" in usage_error(capsys, [*base, "--replica-assignment", "1:x"])
    assert "broker 2 is listed twice" in usage_error(capsys, [*base, "--replica-assignment", "2:2"])
    assert "same number" in usage_error(capsys, [*base, "--replica-assignment", "1:2,3"])
    assert "cannot be combined" in usage_error(
        capsys, [*base, "--replica-assignment", "1:2", "--partitions", "2"]
    )
    assert "outside 1.." in usage_error(capsys, [*base, "--partitions", "0"])
    assert "is not host:port" in usage_error(capsys, ["topics", "list", "--bootstrap", "nope"])
    assert "--timeout must be positive" in usage_error(capsys, [*base, "--timeout", "0"])
    assert calls == []


def test_topics_list(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    listing = metadata_pb2.ListTopicsResponse(
        topics=[
            metadata_pb2.TopicListing(name="b", topic_id="2"),
            metadata_pb2.TopicListing(name="a", topic_id="1"),
        ]
    )
    calls = fake(monkeypatch, "list_topics", listing)
    assert main(["topics", "list", *B]) == 0
    assert capsys.readouterr().out == "a\nb\n"
    assert calls[0][1] == {"linearizable": True}
    assert main(["topics", "list", "--stale", "--json", *B]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"name": "a", "topic_id": "1"},
        {"name": "b", "topic_id": "2"},
    ]
    assert calls[1][1] == {"linearizable": False}


def test_topics_describe_in_kafka_format(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake(monkeypatch, "describe_topics", topics_response())
    assert main(["topics", "describe", *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Topic: foo\tTopicId: AAAAAAAAAAAAAAAAAAAAAQ\tPartitionCount: 3\tReplicationFactor: 3\t"
        "Configs: cleanup.policy=compact,retention.ms=1000",
        "\tTopic: foo\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3\tElr: \tLastKnownElr: ",
        "\tTopic: foo\tPartition: 1\tLeader: none\tReplicas: 2,3,1\tIsr: "
        "\tElr: 2,3\tLastKnownElr: 1",
        "\tTopic: foo\tPartition: 2\tLeader: 3\tReplicas: 3,1,2,4\tIsr: 3,1,2"
        "\tAdding Replicas: 4\tRemoving Replicas: 2\tElr: \tLastKnownElr: ",
    ]
    assert calls[0] == (([],), {"linearizable": True})
    assert main(["topics", "describe", "foo", "--json", *B]) == 0
    out = json.loads(capsys.readouterr().out)
    foo = out["topics"][0]
    assert (foo["partition_count"], foo["replication_factor"]) == (3, 3)
    assert foo["partitions"][1]["leader"] is None
    assert foo["partitions"][1]["isr"] == []
    assert foo["partitions"][1]["elr"] == [2, 3]
    assert foo["partitions"][1]["last_known_elr"] == [1]
    assert foo["partitions"][0]["elr"] == []
    assert foo["partitions"][2]["adding_replicas"] == [4]
    assert out["metadata_offset"] == 99


def test_topics_describe_shows_offline_replicas(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Broker 3 is fenced: partition 0 lost its leader to 1, partition 1 only
    # a follower; partition 2 is not on broker 3.
    response = metadata_pb2.DescribeTopicsResponse(
        topics=[
            metadata_pb2.TopicDescription(
                name="bar",
                topic_id="AAAAAAAAAAAAAAAAAAAAAg",
                partitions=[
                    partition(0, 1, [3, 1, 2], [1, 2], offline=[3]),
                    partition(1, 2, [2, 3, 1], [2, 1], offline=[3]),
                    partition(2, 1, [1, 2, 4], [1, 2, 4]),
                ],
            )
        ]
    )
    fake(monkeypatch, "describe_topics", response)
    assert main(["topics", "describe", "bar", *B]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        "\tTopic: bar\tPartition: 0\tLeader: 1\tReplicas: 3,1,2\tIsr: 1,2"
        "\tElr: \tLastKnownElr: \tOffline: 3",
        "\tTopic: bar\tPartition: 1\tLeader: 2\tReplicas: 2,3,1\tIsr: 2,1"
        "\tElr: \tLastKnownElr: \tOffline: 3",
        # None offline: no Offline field at all.
        "\tTopic: bar\tPartition: 2\tLeader: 1\tReplicas: 1,2,4\tIsr: 1,2,4\tElr: \tLastKnownElr: ",
    ]
    assert main(["topics", "describe", "bar", "--json", *B]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["offline_replicas"] for p in out["topics"][0]["partitions"]] == [[3], [3], []]


def test_topics_describe_filters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "describe_topics", topics_response())
    cluster = metadata_pb2.DescribeClusterResponse(
        brokers=[
            metadata_pb2.BrokerDescription(broker_id=1),
            metadata_pb2.BrokerDescription(broker_id=2),
            metadata_pb2.BrokerDescription(broker_id=3, fenced=True),
        ]
    )
    cluster_calls = fake(monkeypatch, "describe_cluster", cluster)
    assert main(["topics", "describe", "--under-replicated-partitions", *B]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[2] for line in lines] == ["Partition: 1"]
    assert cluster_calls == []
    assert main(["topics", "describe", "--unavailable-partitions", *B]) == 0
    lines = capsys.readouterr().out.splitlines()
    # Partition 1 has no leader; partition 2's leader (3) is fenced.
    assert [line.split("\t")[2] for line in lines] == ["Partition: 1", "Partition: 2"]
    assert len(cluster_calls) == 1


def test_topics_describe_unknown_topic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = topics_response()
    response.topics.add(
        name="nope", error=metadata_pb2.UNKNOWN_TOPIC_OR_PARTITION, message="no topic nope"
    )
    fake(monkeypatch, "describe_topics", response)
    assert main(["topics", "describe", "foo", "nope", *B]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("Topic: foo")
    assert "UNKNOWN_TOPIC_OR_PARTITION: no topic nope" in captured.err


def test_topics_delete(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    response = metadata_pb2.DeleteTopicsResponse(
        topics=[
            metadata_pb2.DeletableTopicResult(name="a", topic_id="1"),
            metadata_pb2.DeletableTopicResult(
                name="b", error=metadata_pb2.UNKNOWN_TOPIC_OR_PARTITION, message="no topic b"
            ),
        ]
    )
    calls = fake(monkeypatch, "delete_topics", response)
    assert main(["topics", "delete", "a", "b", "a", *B]) == 1
    captured = capsys.readouterr()
    assert captured.out == "Deleted topic a.\n"
    assert "UNKNOWN_TOPIC_OR_PARTITION: no topic b" in captured.err
    assert calls[0][0] == (["a", "b"],)
    assert main(["topics", "delete", "a", "b", "--if-exists", *B]) == 0
    assert main(["topics", "delete", "a", "b", "--if-exists", "--json", *B]) == 0
    out = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert out["ok"] and [t["deleted"] for t in out["topics"]] == [True, False]


def test_topics_add_partitions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = metadata_pb2.CreatePartitionsResponse(
        topics=[metadata_pb2.CreatePartitionsTopicResult(name="foo")]
    )
    calls = fake(monkeypatch, "create_partitions", response)
    fake(monkeypatch, "describe_topics", topics_response())
    assert main(["topics", "add-partitions", "foo", "--partitions", "5", *B]) == 0
    assert capsys.readouterr().out == "Topic foo now has 5 partitions.\n"
    assert calls[0] == (([NewPartitions("foo", 5, {})],), {"validate_only": False})
    argv = ["topics", "add-partitions", "foo", "--partitions", "5", "--replica-assignment"]
    assert main([*argv, "1:2,2:3", *B]) == 0
    assert calls[1][0][0] == [NewPartitions("foo", 5, {3: [1, 2], 4: [2, 3]})]
    assert main([*argv, "1:2", *B]) == 2
    assert "adds 2" in capsys.readouterr().err
    fake(
        monkeypatch,
        "create_partitions",
        metadata_pb2.CreatePartitionsResponse(
            topics=[
                metadata_pb2.CreatePartitionsTopicResult(
                    name="foo", error=metadata_pb2.INVALID_PARTITIONS, message="foo has 3"
                )
            ]
        ),
    )
    assert main(["topics", "add-partitions", "foo", "--partitions", "2", *B]) == 1
    assert "INVALID_PARTITIONS: foo has 3" in capsys.readouterr().err


def test_client_failures_map_to_exit_statuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "list_topics", NoControllerError("no active controller answered within 5 s"))
    assert main(["topics", "list", *B]) == 1
    assert "no active controller answered" in capsys.readouterr().err
    fake(monkeypatch, "delete_topics", IndeterminateError("it may or may not have been applied"))
    assert main(["topics", "delete", "a", *B]) == 3
    assert "INDETERMINATE" in capsys.readouterr().err
    fake(monkeypatch, "unregister_broker", MetadataClientError(Errors.NOT_CONTROLLER, "moved"))
    assert main(["brokers", "unregister", "3", *B, "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ok": False, "error": "NOT_CONTROLLER", "message": "moved"}
    assert "NOT_CONTROLLER: moved" in captured.err


def test_local_cluster_is_the_default_bootstrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "list_topics", metadata_pb2.ListTopicsResponse())
    status = main(["topics", "list", "--cluster-dir", str(tmp_path / "none")])
    assert status == 2
    assert "--bootstrap-server is required" in capsys.readouterr().err
    assert main(["topics", "list", "--bootstrap-server", "h:1,h:2"]) == 0


# -- kq configs ------------------------------------------------------------------


def test_configs_describe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = metadata_pb2.DescribeConfigsResponse(
        results=[
            metadata_pb2.DescribeConfigsResult(
                type=metadata_pb2.TOPIC,
                name="foo",
                entries=[
                    metadata_pb2.ConfigEntry(
                        name="retention.ms", value="1000", source=metadata_pb2.TOPIC_CONFIG
                    ),
                    metadata_pb2.ConfigEntry(
                        name="cleanup.policy", value="delete", source=metadata_pb2.DEFAULT_CONFIG
                    ),
                ],
            )
        ]
    )
    calls = fake(monkeypatch, "describe_configs", response)
    argv = ["configs", "describe", "--entity-type", "topics", "--entity-name", "foo", *B]
    assert main([*argv, "--all"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "All configs for topic foo are:",
        "  cleanup.policy=delete source=DEFAULT_CONFIG",
        "  retention.ms=1000 source=TOPIC_CONFIG",
    ]
    assert calls[0] == (
        ([ConfigResource.topic("foo")],),
        {"include_defaults": True, "linearizable": True},
    )
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["resources"][0]["type"] == "topic"
    assert out["resources"][0]["configs"][1] == {
        "name": "retention.ms",
        "value": "1000",
        "source": "TOPIC_CONFIG",
    }


def test_configs_describe_every_broker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = metadata_pb2.DescribeClusterResponse(
        brokers=[
            metadata_pb2.BrokerDescription(broker_id=10),
            metadata_pb2.BrokerDescription(broker_id=9),
        ]
    )
    fake(monkeypatch, "describe_cluster", cluster)
    calls = fake(monkeypatch, "describe_configs", metadata_pb2.DescribeConfigsResponse())
    assert main(["configs", "describe", "--entity-type", "brokers", *B]) == 0
    assert calls[0][0] == ([ConfigResource.broker(9), ConfigResource.broker(10)],)
    assert main(["configs", "describe", "--entity-type", "cluster", *B]) == 0
    assert calls[1][0] == ([ConfigResource.cluster()],)
    argv = ["configs", "describe", "--entity-type"]
    assert "not used with --entity-type cluster" in usage_error(
        capsys, [*argv, "cluster", "--entity-name", "x", *B]
    )
    assert "'x' is not an integer" in usage_error(
        capsys, [*argv, "brokers", "--entity-name", "x", *B]
    )
    assert "invalid choice" in usage_error(capsys, [*argv, "users", *B])


def test_configs_alter(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ok = metadata_pb2.AlterConfigsResponse(
        results=[metadata_pb2.AlterConfigsResult(type=metadata_pb2.TOPIC, name="foo")]
    )
    calls = fake(monkeypatch, "alter_configs", ok)
    argv = ["configs", "alter", "--entity-type", "topics", "--entity-name", "foo", *B]
    assert (
        main(
            [
                *argv,
                "--add-config",
                "retention.ms=1000,cleanup.policy=[compact,delete]",
                "--delete-config",
                "segment.ms",
                "--if-value",
                "retention.ms=500",
                "--if-absent",
                "segment.ms",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "Completed updating config for topic foo.\n"
    (changes,), kwargs = calls[0]
    assert changes == {
        ConfigResource.topic("foo"): [
            ConfigOp("retention.ms", "1000", expected="500"),
            ConfigOp("cleanup.policy", "compact,delete"),
            ConfigOp("segment.ms", None, expect_absent=True),
        ]
    }
    assert kwargs == {"validate_only": False}
    cluster = ["configs", "alter", "--entity-type", "cluster", *B]
    assert main([*cluster, "--add-config", "num.partitions=3", "--validate-only"]) == 0
    assert "nothing was changed" in capsys.readouterr().out
    assert calls[1][0][0] == {ConfigResource.cluster(): [ConfigOp("num.partitions", "3")]}


def test_configs_alter_precondition_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = metadata_pb2.AlterConfigsResponse(
        results=[
            metadata_pb2.AlterConfigsResult(
                type=metadata_pb2.TOPIC,
                name="foo",
                error=metadata_pb2.CONFIG_PRECONDITION_FAILED,
                message="config retention.ms of topic:foo is '700', not '500'",
                current=[
                    metadata_pb2.CurrentConfigValue(key="retention.ms", present=True, value="700")
                ],
            )
        ]
    )
    fake(monkeypatch, "alter_configs", failed)
    argv = ["configs", "alter", "--entity-type", "topics", "--entity-name", "foo", *B]
    argv += ["--add-config", "retention.ms=1000", "--if-value", "retention.ms=500"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "CONFIG_PRECONDITION_FAILED" in err
    assert "retention.ms is '700'" in err and "nothing was changed" in err
    assert main([*argv, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"]
    assert out["resources"][0]["current"] == [
        {"key": "retention.ms", "present": True, "value": "700"}
    ]


def test_configs_alter_bad_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake(monkeypatch, "alter_configs", metadata_pb2.AlterConfigsResponse())
    argv = ["configs", "alter", "--entity-type", "topics", "--entity-name", "foo", *B]
    assert "nothing to change" in usage_error(capsys, argv)
    assert "needs --entity-name" in usage_error(
        capsys, ["configs", "alter", "--entity-type", "topics", "--add-config", "a=1", *B]
    )
    assert "not key=value" in usage_error(capsys, [*argv, "--add-config", "a=1,b"])
    assert "unbalanced" in usage_error(capsys, [*argv, "--add-config", "a=[1,2"])
    assert "both set and deleted" in usage_error(
        capsys, [*argv, "--add-config", "a=1", "--delete-config", "a"]
    )
    assert "which is not changed" in usage_error(
        capsys, [*argv, "--add-config", "a=1", "--if-value", "b=2"]
    )
    assert "two conditions" in usage_error(
        capsys, [*argv, "--add-config", "a=1", "--if-value", "a=2", "--if-absent", "a"]
    )
    assert "not a list of config keys" in usage_error(capsys, [*argv, "--delete-config", "a,,b"])
    assert calls == []


# -- kq brokers ------------------------------------------------------------------


def test_brokers_list(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = metadata_pb2.DescribeClusterResponse(
        cluster_id="c1",
        controller_id=2,
        brokers=[
            metadata_pb2.BrokerDescription(
                broker_id=5,
                broker_epoch=40,
                fenced=True,
                in_controlled_shutdown=True,
                endpoints=[metadata_pb2.Endpoint(name="PLAINTEXT", host="h5", port=9092)],
            ),
            metadata_pb2.BrokerDescription(
                broker_id=4,
                broker_epoch=12,
                rack="r1",
                endpoints=[
                    metadata_pb2.Endpoint(name="PLAINTEXT", host="h4", port=9092),
                    metadata_pb2.Endpoint(name="INTERNAL", host="h4", port=9093),
                ],
            ),
            metadata_pb2.BrokerDescription(broker_id=6, broker_epoch=41, fenced=True),
        ],
    )
    fake(monkeypatch, "describe_cluster", cluster)
    assert main(["brokers", "list", *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Id  Rack  State                Epoch  Endpoints",
        "4   r1    unfenced             12     PLAINTEXT://h4:9092,INTERNAL://h4:9093",
        "5   -     controlled-shutdown  40     PLAINTEXT://h5:9092",
        "6   -     fenced               41",
    ]
    assert main(["brokers", "list", "--json", *B]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["controller_id"] == 2
    assert [b["state"] for b in out["brokers"]] == ["unfenced", "controlled-shutdown", "fenced"]
    assert out["brokers"][0]["rack"] == "r1" and out["brokers"][1]["rack"] is None


def test_brokers_unregister(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = fake(monkeypatch, "unregister_broker", metadata_pb2.UnregisterBrokerResponse())
    assert main(["brokers", "unregister", "7", *B]) == 0
    assert capsys.readouterr().out == "Unregistered broker 7.\n"
    assert calls == [((7,), {})]
    assert "broker id 'seven' is not an integer" in usage_error(
        capsys, ["brokers", "unregister", "seven", *B]
    )
    assert "outside 0.." in usage_error(capsys, ["brokers", "unregister", "-1", *B])


# -- kq leader-election ----------------------------------------------------------


def test_leader_election(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = metadata_pb2.ElectLeadersResponse(
        results=[
            metadata_pb2.PartitionResult(topic="foo", partition=0),
            metadata_pb2.PartitionResult(topic="foo", partition=1),
            metadata_pb2.PartitionResult(
                topic="foo", partition=2, error=metadata_pb2.ELECTION_NOT_NEEDED
            ),
        ]
    )
    calls = fake(monkeypatch, "elect_leaders", response)
    fake(monkeypatch, "describe_topics", topics_response())
    assert main(["leader-election", "--type", "preferred", "--topic", "foo", *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Successfully completed leader election (PREFERRED) for partitions foo-0, foo-1",
        "Valid replica already elected for partitions foo-2",
    ]
    assert calls[0][0] == (
        metadata_pb2.PREFERRED,
        [TopicPartition("foo", 0), TopicPartition("foo", 1), TopicPartition("foo", 2)],
    )
    argv = ["leader-election", "--type", "UNCLEAN", "--topic", "foo", "--partition", "1", *B]
    assert main(argv) == 0
    capsys.readouterr()
    assert calls[1][0] == (metadata_pb2.UNCLEAN, [TopicPartition("foo", 1)])
    assert main(["leader-election", "--type", "preferred", "--all-topic-partitions", *B]) == 0
    capsys.readouterr()
    assert calls[2][0] == (metadata_pb2.PREFERRED, [])


def test_leader_election_failures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = metadata_pb2.ElectLeadersResponse(
        results=[
            metadata_pb2.PartitionResult(
                topic="foo",
                partition=1,
                error=metadata_pb2.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                message="no replica of foo-1 is alive",
            )
        ]
    )
    fake(monkeypatch, "elect_leaders", response)
    argv = ["leader-election", "--type", "unclean", "--all-topic-partitions", *B]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (
        "Error completing leader election (UNCLEAN) for partition: foo-1: "
        "ELIGIBLE_LEADERS_NOT_AVAILABLE: no replica of foo-1 is alive"
    ) in err
    assert "--partition needs --topic" in usage_error(
        capsys,
        [
            "leader-election",
            "--type",
            "preferred",
            "--all-topic-partitions",
            "--partition",
            "1",
            *B,
        ],
    )
    assert "not allowed with" in usage_error(
        capsys,
        ["leader-election", "--type", "preferred", "--all-topic-partitions", "--topic", "t", *B],
    )
    assert "invalid choice" in usage_error(
        capsys, ["leader-election", "--type", "random", "--topic", "t", *B]
    )


# -- kq reassign -----------------------------------------------------------------


def write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "plan.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_reassign_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = {
        "version": 1,
        "partitions": [
            {"topic": "foo", "partition": 0, "replicas": [5, 6]},
            {"topic": "foo", "partition": 2, "replicas": [1, 2, 3], "log_dirs": ["any"] * 3},
        ],
    }
    fake(monkeypatch, "describe_topics", topics_response())
    calls = fake(
        monkeypatch,
        "alter_partition_reassignments",
        metadata_pb2.AlterPartitionReassignmentsResponse(
            results=[
                metadata_pb2.PartitionResult(topic="foo", partition=0),
                metadata_pb2.PartitionResult(topic="foo", partition=2),
            ]
        ),
    )
    argv = ["reassign", "start", "--reassignment-json-file", write(tmp_path, plan), *B]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "Current partition replica assignment"
    # Partition 2's replicas before its reassignment in progress (4 is being added).
    assert json.loads(out[2]) == {
        "version": 1,
        "partitions": [
            {"topic": "foo", "partition": 0, "replicas": [1, 2, 3], "log_dirs": ["any"] * 3},
            {"topic": "foo", "partition": 2, "replicas": [3, 1, 2], "log_dirs": ["any"] * 3},
        ],
    }
    assert out[4] == "Save this to use as the --reassignment-json-file option during rollback"
    assert out[5] == "Successfully started partition reassignments for foo-0,foo-2"
    assert calls[0][0] == ([Reassignment("foo", 0, (5, 6)), Reassignment("foo", 2, (1, 2, 3))],)


def test_reassign_start_refusals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "describe_topics", topics_response())
    calls = fake(
        monkeypatch,
        "alter_partition_reassignments",
        metadata_pb2.AlterPartitionReassignmentsResponse(
            results=[
                metadata_pb2.PartitionResult(
                    topic="foo",
                    partition=0,
                    error=metadata_pb2.INVALID_REPLICA_ASSIGNMENT,
                    message="broker 9 is not registered",
                )
            ]
        ),
    )
    plan = {"partitions": [{"topic": "foo", "partition": 7, "replicas": [1]}]}
    argv = ["reassign", "start", "--reassignment-json-file", write(tmp_path, plan), *B]
    assert main(argv) == 1
    assert "no such partition: foo-7; nothing was started" in capsys.readouterr().err
    assert calls == []
    plan = {"partitions": [{"topic": "foo", "partition": 0, "replicas": [9]}]}
    argv = ["reassign", "start", "--reassignment-json-file", write(tmp_path, plan), *B]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "foo-0: INVALID_REPLICA_ASSIGNMENT: broker 9 is not registered" in err


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ("{", "is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        ([], "the document must be an object"),
        ({"version": 2, "partitions": []}, "version 2 is not supported"),
        ({"partitions": {}}, '"partitions" must be a list'),
        ({"partitions": []}, "names no partition"),
        ({"partitions": [{"partition": 0, "replicas": [1]}]}, '"topic" must be a non-empty'),
        ({"partitions": [{"topic": "t", "partition": "0", "replicas": [1]}]}, '"partition" must'),
        ({"partitions": [{"topic": "t", "partition": 0}]}, '"replicas" must be a non-empty list'),
        ({"partitions": [{"topic": "t", "partition": 0, "replicas": []}]}, '"replicas" must be'),
        ({"partitions": [{"topic": "t", "partition": 0, "replicas": ["x"]}]}, "'x', which is not"),
        ({"partitions": [{"topic": "t", "partition": 0, "replicas": [1, 1]}]}, "a broker twice"),
        (
            {"partitions": [{"topic": "t", "partition": 0, "replicas": [1], "log_dirs": []}]},
            "one directory per replica",
        ),
        (
            {
                "partitions": [
                    {"topic": "t", "partition": 0, "replicas": [1]},
                    {"topic": "t", "partition": 0, "replicas": [2]},
                ]
            },
            "partitions[1]: t-0 is listed twice",
        ),
    ],
)
def test_reassignment_file_errors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    doc: Any,
    problem: str,
) -> None:
    calls = fake(monkeypatch, "describe_topics", topics_response())
    path = write(tmp_path, doc)
    err = usage_error(capsys, ["reassign", "start", "--reassignment-json-file", path, *B])
    assert problem in err and path in err
    assert calls == []


def test_reassignment_file_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.json")
    err = usage_error(capsys, ["reassign", "cancel", "--reassignment-json-file", missing, *B])
    assert f"cannot read reassignment JSON file {missing}" in err


def test_reassign_list_and_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(
        monkeypatch,
        "list_partition_reassignments",
        metadata_pb2.ListPartitionReassignmentsResponse(),
    )
    assert main(["reassign", "list", *B]) == 0
    assert capsys.readouterr().out == "No partition reassignments found.\n"
    ongoing = metadata_pb2.ListPartitionReassignmentsResponse(
        reassignments=[
            metadata_pb2.OngoingReassignment(
                topic="foo",
                partition=2,
                replicas=[3, 1, 2, 4],
                adding_replicas=[4],
                removing_replicas=[2],
            )
        ]
    )
    fake(monkeypatch, "list_partition_reassignments", ongoing)
    assert main(["reassign", "list", *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Current partition reassignments:",
        "foo-2: replicas: 3,1,2,4. adding: 4. removing: 2.",
    ]
    calls = fake(
        monkeypatch,
        "alter_partition_reassignments",
        metadata_pb2.AlterPartitionReassignmentsResponse(
            results=[
                metadata_pb2.PartitionResult(topic="foo", partition=2),
                metadata_pb2.PartitionResult(
                    topic="foo", partition=0, error=metadata_pb2.NO_REASSIGNMENT_IN_PROGRESS
                ),
            ]
        ),
    )
    plan = {"partitions": [{"topic": "foo", "partition": 2}, {"topic": "foo", "partition": 0}]}
    assert main(["reassign", "cancel", "--reassignment-json-file", write(tmp_path, plan), *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Successfully cancelled partition reassignments for: foo-2",
        "No reassignment was in progress for: foo-0",
    ]
    assert calls[0][0] == ([Reassignment("foo", 2, None), Reassignment("foo", 0, None)],)


# -- kq features -----------------------------------------------------------------


def test_features_describe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    response = metadata_pb2.DescribeFeaturesResponse(
        features=[
            metadata_pb2.FeatureDescription(
                name="metadata.version",
                supported_min_version=1,
                supported_max_version=4,
                finalized_level=3,
            ),
            metadata_pb2.FeatureDescription(
                name="kraft.version", supported_min_version=0, supported_max_version=1
            ),
        ],
        metadata_offset=17,
    )
    fake(monkeypatch, "describe_features", response)
    assert main(["features", "describe", *B]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Feature: kraft.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 1\t"
        "FinalizedVersionLevel: -",
        "Feature: metadata.version\tSupportedMinVersion: 1\tSupportedMaxVersion: 4\t"
        "FinalizedVersionLevel: 3",
    ]
    assert main(["features", "describe", "--json", *B]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["features"][0]["finalized_level"] is None and out["metadata_offset"] == 17


def test_every_command_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ["topics", "configs", "brokers", "leader-election", "reassign", "features"]:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0
        assert "unavailable" not in capsys.readouterr().out


def test_leader_election_never_sends_an_empty_list_for_a_topic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = metadata_pb2.DescribeTopicsResponse(
        topics=[metadata_pb2.TopicDescription(name="foo", topic_id="x")]
    )
    fake(monkeypatch, "describe_topics", empty)
    calls = fake(monkeypatch, "elect_leaders", metadata_pb2.ElectLeadersResponse())
    assert main(["leader-election", "--type", "preferred", "--topic", "foo", *B]) == 1
    assert "has no partition" in capsys.readouterr().err
    assert calls == []


def test_commands_over_grpc_to_fake_controllers(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole path: the command, the client, a standby's redirect, the
    active controller's answer."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = threading.Event()
    found: list[tuple[FakeController, FakeController]] = []

    async def serve() -> None:
        async with two_controllers() as pair:
            found.append(pair)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        standby, active = found[0]
        argv = ["--bootstrap", f"{dead()},{standby.address}", "--timeout", "5"]
        assert main(["topics", "create", "foo", "--partitions", "2", *argv]) == 0
        assert capsys.readouterr().out == "Created topic foo.\n"
        assert active.calls("CreateTopics") == 1 and standby.calls("CreateTopics") == 0
        assert main(["features", "describe", "--stale", *argv]) == 0
        assert "FinalizedVersionLevel: 2" in capsys.readouterr().out
        # No controller knows an active one, so the write is never sent: an
        # answer that depends on no timing (a write cut by the deadline
        # after it was sent is INDETERMINATE instead, and rightly so).
        active.points_to = standby.points_to = (-1, "")
        assert main(["brokers", "unregister", "3", *argv[:2], "--timeout", "0.5"]) == 1
        err = capsys.readouterr().err
        assert "no active controller answered" in err and "was not sent" in err
        assert active.calls("UnregisterBroker") == 0
    finally:
        stop.set()
        thread.join(10)
        loop.close()


def dead() -> str:
    return f"127.0.0.1:{free_ports(1)[0]}"

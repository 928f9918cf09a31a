"""proto/kqproto/metadata.proto: the error enum mirrors metadata.errors, and every
response has the shape the client relies on."""

from __future__ import annotations

import grpc
from google.protobuf.descriptor import FieldDescriptor

from kqproto import metadata_pb2, metadata_pb2_grpc, quorum_pb2
from metadata.errors import Errors

ADMIN_RPCS = {
    "CreateTopics",
    "DeleteTopics",
    "CreatePartitions",
    "DescribeTopics",
    "ListTopics",
    "DescribeCluster",
    "DescribeConfigs",
    "AlterConfigs",
    "ElectLeaders",
    "AlterPartitionReassignments",
    "ListPartitionReassignments",
    "UnregisterBroker",
    "DescribeFeatures",
    "UpdateFeatures",
    "CreateAcls",
    "DeleteAcls",
    "DescribeAcls",
}
LIFECYCLE_RPCS = {"RegisterBroker", "BrokerHeartbeat", "AlterPartition", "AllocateProducerIds"}
# Reads: they take `linearizable` and answer with the `metadata_offset` they reflect.
READS = {
    "DescribeTopics",
    "ListTopics",
    "DescribeCluster",
    "DescribeConfigs",
    "ListPartitionReassignments",
    "DescribeFeatures",
    "DescribeAcls",
}


def test_metadata_error_mirrors_errors() -> None:
    assert dict(metadata_pb2.MetadataError.items()) == {e.name: e.value for e in Errors}


def test_small_enums() -> None:
    assert dict(metadata_pb2.ConfigResourceType.items()) == {"CLUSTER": 0, "BROKER": 1, "TOPIC": 2}
    assert dict(metadata_pb2.ElectionType.items()) == {"PREFERRED": 0, "UNCLEAN": 1}
    assert dict(metadata_pb2.AlterConfigOpType.items()) == {"SET": 0, "DELETE": 1}
    assert set(metadata_pb2.ConfigSource.keys()) == {
        "DEFAULT_CONFIG",
        "CLUSTER_CONFIG",
        "BROKER_CONFIG",
        "TOPIC_CONFIG",
    }


def test_config_resource_types_match_the_controller() -> None:
    from metadata.configs import ResourceType

    assert dict(metadata_pb2.ConfigResourceType.items()) == {t.name: t.value for t in ResourceType}


def test_services_have_every_rpc() -> None:
    admin = metadata_pb2.DESCRIPTOR.services_by_name["AdminService"]
    lifecycle = metadata_pb2.DESCRIPTOR.services_by_name["BrokerLifecycleService"]
    assert {m.name for m in admin.methods} == ADMIN_RPCS
    assert {m.name for m in lifecycle.methods} == LIFECYCLE_RPCS
    assert admin.full_name == "kq.metadata.AdminService"
    for rpc in ADMIN_RPCS:
        assert callable(getattr(metadata_pb2_grpc.AdminServiceServicer, rpc))
    for rpc in LIFECYCLE_RPCS:
        assert callable(getattr(metadata_pb2_grpc.BrokerLifecycleServiceServicer, rpc))
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        stub = metadata_pb2_grpc.AdminServiceStub(channel)
        assert all(callable(getattr(stub, rpc)) for rpc in ADMIN_RPCS)
    finally:
        channel.close()


def test_every_response_starts_with_error_message_leader() -> None:
    for service in metadata_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            fields = method.output_type.fields_by_number
            error, message, leader = fields[1], fields[2], fields[3]
            assert error.enum_type is not None and leader.message_type is not None
            assert (error.name, error.enum_type.full_name) == (
                "error",
                "kq.metadata.MetadataError",
            ), method.name
            assert (message.name, message.type) == ("message", FieldDescriptor.TYPE_STRING)
            assert (leader.name, leader.message_type.full_name) == (
                "leader",
                "kq.quorum.LeaderHint",
            )


def test_reads_are_marked() -> None:
    admin = metadata_pb2.DESCRIPTOR.services_by_name["AdminService"]
    for method in admin.methods:
        takes = "linearizable" in method.input_type.fields_by_name
        reflects = "metadata_offset" in method.output_type.fields_by_name
        assert takes == (method.name in READS), method.name
        assert reflects == (method.name in READS), method.name


def test_round_trip_with_optional_rack_and_maps() -> None:
    broker = metadata_pb2.BrokerDescription(broker_id=1, broker_epoch=7)
    assert not broker.HasField("rack")
    broker.rack = ""
    parsed = metadata_pb2.BrokerDescription.FromString(broker.SerializeToString())
    assert parsed.HasField("rack") and parsed.rack == ""
    topic = metadata_pb2.CreatableTopic(
        name="t",
        num_partitions=-1,
        replication_factor=-1,
        assignments=[metadata_pb2.ReplicaAssignment(partition=0, replicas=[3, 1])],
        configs={"retention.ms": "1000"},
    )
    again = metadata_pb2.CreatableTopic.FromString(topic.SerializeToString())
    assert again == topic
    assert again.num_partitions == -1 and dict(again.configs) == {"retention.ms": "1000"}
    response = metadata_pb2.CreateTopicsResponse(
        error=metadata_pb2.NOT_CONTROLLER,
        leader=quorum_pb2.LeaderHint(leader_id=2, leader_address="h:1", epoch=3),
    )
    assert metadata_pb2.CreateTopicsResponse.FromString(response.SerializeToString()) == response

"""The data plane's error codes have Kafka's names and numbers, and every code
of the partition log is one of them."""

from __future__ import annotations

import pytest

from broker.errors import Errors, ReplicaError, from_name, from_partition_log_error
from kqproto import broker_pb2
from partition_log.errors import Errors as LogErrors
from partition_log.errors import PartitionLogError

# Errors.java, for the codes the brief and brokers.md §6.3 name.
KAFKA = {
    "UNKNOWN_SERVER_ERROR": -1,
    "NONE": 0,
    "OFFSET_OUT_OF_RANGE": 1,
    "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "LEADER_NOT_AVAILABLE": 5,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REQUEST_TIMED_OUT": 7,
    "BROKER_NOT_AVAILABLE": 8,
    "REPLICA_NOT_AVAILABLE": 9,
    "MESSAGE_TOO_LARGE": 10,
    "OFFSET_METADATA_TOO_LARGE": 12,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "NOT_COORDINATOR": 16,
    "INVALID_TOPIC_EXCEPTION": 17,
    "RECORD_LIST_TOO_LARGE": 18,
    "NOT_ENOUGH_REPLICAS": 19,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "INVALID_REQUIRED_ACKS": 21,
    "INVALID_GROUP_ID": 24,
    "UNKNOWN_MEMBER_ID": 25,
    "INVALID_SESSION_TIMEOUT": 26,
    "TOPIC_AUTHORIZATION_FAILED": 29,
    "GROUP_AUTHORIZATION_FAILED": 30,
    "CLUSTER_AUTHORIZATION_FAILED": 31,
    "INVALID_TIMESTAMP": 32,
    "UNSUPPORTED_VERSION": 35,
    "INVALID_REQUEST": 42,
    "POLICY_VIOLATION": 44,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
    "DUPLICATE_SEQUENCE_NUMBER": 46,
    "INVALID_PRODUCER_EPOCH": 47,
    "INVALID_TXN_STATE": 48,
    "INVALID_PRODUCER_ID_MAPPING": 49,
    "INVALID_TRANSACTION_TIMEOUT": 50,
    "CONCURRENT_TRANSACTIONS": 51,
    "TRANSACTION_COORDINATOR_FENCED": 52,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
    "OPERATION_NOT_ATTEMPTED": 55,
    "KAFKA_STORAGE_ERROR": 56,
    "UNKNOWN_PRODUCER_ID": 59,
    "NON_EMPTY_GROUP": 68,
    "GROUP_ID_NOT_FOUND": 69,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75,
    "UNSUPPORTED_COMPRESSION_TYPE": 76,
    "STALE_BROKER_EPOCH": 77,
    "OFFSET_NOT_AVAILABLE": 78,
    "GROUP_MAX_SIZE_REACHED": 81,
    "FENCED_INSTANCE_ID": 82,
    "GROUP_SUBSCRIBED_TO_TOPIC": 86,
    "INVALID_RECORD": 87,
    "UNSTABLE_OFFSET_COMMIT": 88,
    "THROTTLING_QUOTA_EXCEEDED": 89,
    "PRODUCER_FENCED": 90,
    "INVALID_UPDATE_VERSION": 95,
    "UNKNOWN_TOPIC_ID": 100,
    "INCONSISTENT_TOPIC_ID": 103,
    "TRANSACTIONAL_ID_NOT_FOUND": 105,
    "INELIGIBLE_REPLICA": 107,
    "NEW_LEADER_ELECTED": 108,
    "FENCED_MEMBER_EPOCH": 110,
    "UNRELEASED_INSTANCE_ID": 111,
    "UNSUPPORTED_ASSIGNOR": 112,
    "STALE_MEMBER_EPOCH": 113,
}


@pytest.mark.parametrize("name", sorted(KAFKA))
def test_kafka_numbers(name: str) -> None:
    assert Errors[name] == KAFKA[name]


def test_every_code_is_one_of_kafkas() -> None:
    assert {e.name: e.value for e in Errors} == KAFKA


def test_the_wire_enum_mirrors_the_codes() -> None:
    assert dict(broker_pb2.BrokerError.items()) == {e.name: e.value for e in Errors}


@pytest.mark.parametrize("code", list(LogErrors), ids=lambda c: c.name)
def test_every_partition_log_code_is_here_with_its_number(code: LogErrors) -> None:
    assert Errors[code.name] == int(code)


@pytest.mark.parametrize("code", list(LogErrors), ids=lambda c: c.name)
def test_a_log_refusal_maps_to_its_code(code: LogErrors) -> None:
    assert from_partition_log_error(PartitionLogError(code, "why")) is Errors[code.name]


def test_from_name_refuses_an_unknown_name() -> None:
    assert from_name("FENCED_LEADER_EPOCH") is Errors.FENCED_LEADER_EPOCH
    with pytest.raises(ValueError, match="'NOT_A_CODE'"):
        from_name("NOT_A_CODE")


def test_replica_error_names_its_code() -> None:
    assert (
        str(ReplicaError(Errors.NOT_ENOUGH_REPLICAS, "isr [0]")) == "NOT_ENOUGH_REPLICAS: isr [0]"
    )

"""The partition log's error codes are Kafka's (Errors.java)."""

from __future__ import annotations

from partition_log.errors import Errors, PartitionLogError


def test_codes_are_kafkas() -> None:
    assert Errors.OFFSET_OUT_OF_RANGE == 1
    assert Errors.CORRUPT_MESSAGE == 2
    assert Errors.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
    assert Errors.INVALID_PRODUCER_EPOCH == 47
    assert Errors.UNKNOWN_PRODUCER_ID == 59


def test_a_refusal_names_its_code_and_what_was_wrong() -> None:
    error = PartitionLogError(Errors.CORRUPT_MESSAGE, "CRC 0x1 at offset 7, computed 0x2")
    assert error.code is Errors.CORRUPT_MESSAGE
    assert str(error) == "CORRUPT_MESSAGE: CRC 0x1 at offset 7, computed 0x2"

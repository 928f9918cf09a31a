"""A controller's error code as the broker's (server/broker.py): the same
name, or UNKNOWN_SERVER_ERROR when the data plane has no such code."""

from __future__ import annotations

from broker.errors import Errors
from metadata.errors import Errors as MetadataErrors
from server.broker import _error_name


def test_a_controller_error_maps_by_its_name_not_its_number() -> None:
    for name in ("FENCED_LEADER_EPOCH", "STALE_BROKER_EPOCH", "INELIGIBLE_REPLICA"):
        assert _error_name(MetadataErrors[name].value) is Errors[name]


def test_an_error_the_data_plane_lacks_is_unknown() -> None:
    assert "NOT_CONTROLLER" not in Errors.__members__
    assert _error_name(MetadataErrors.NOT_CONTROLLER.value) is Errors.UNKNOWN_SERVER_ERROR
    assert _error_name(999_999) is Errors.UNKNOWN_SERVER_ERROR

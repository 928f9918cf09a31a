"""Configs (Kafka's ConfigurationControlManager): incremental alters
(KIP-339) with conditions, all or nothing.  Pure: decisions only."""

from __future__ import annotations

from collections.abc import Sequence

from metadata import configs
from metadata.configs import ResourceType
from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.records import (
    ConfigRecord,
    Record,
)
from metadata.requests import (
    AlterConfigOp,
    ControllerResult,
    ItemResult,
    items_ok,
)

__all__ = ["ConfigControl"]


class ConfigControl:
    """Decides on :class:`ControlState`'s image; changes nothing."""

    def __init__(self, state: ControlState) -> None:
        self.state = state

    def alter_configs(
        self,
        changes: Sequence[tuple[ResourceType, str, Sequence[AlterConfigOp]]],
        validate_only: bool = False,
    ) -> ControllerResult[list[ItemResult]]:
        """Incremental alter (KIP-339) with conditions.  All or nothing:
        when any resource is refused (a failed condition, a bad value, an
        unknown topic), nothing of the request is written, so a request is
        a linearizable compare-and-set on configs."""
        results: list[ItemResult] = []
        records: list[Record] = []
        for rtype, rname, ops in changes:
            label = (
                "the cluster" if rtype is ResourceType.CLUSTER else f"{rtype.name.lower()} {rname}"
            )
            try:
                configs.validate_resource(rtype, rname)
                if rtype is ResourceType.TOPIC and rname not in self.state.image.topic_ids:
                    raise ApiError(
                        Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {rname} does not exist"
                    )
                current = self.state.image.config((int(rtype), rname))
                made: list[Record] = []
                keys: set[str] = set()
                mismatches: list[str] = []
                for op in ops:
                    if op.key in keys:
                        raise ApiError(Errors.INVALID_REQUEST, f"config {op.key} is altered twice")
                    keys.add(op.key)
                    value = None
                    if op.value is not None:
                        value = configs.validate(rtype, rname, op.key, op.value)
                    else:
                        configs.lookup(rtype, op.key)
                    found = current.get(op.key)
                    if op.conditional and (
                        (op.expect_absent and found is not None)
                        or (not op.expect_absent and found != op.expected)
                    ):
                        mismatches.append(
                            f"{op.key} is "
                            + ("unset" if found is None else repr(found))
                            + ", not "
                            + ("unset" if op.expect_absent else repr(op.expected))
                        )
                    made.append(ConfigRecord(int(rtype), rname, op.key, value))
                if mismatches:
                    raise ApiError(
                        Errors.CONFIG_PRECONDITION_FAILED,
                        f"on {label}: " + "; ".join(mismatches),
                    )
            except ApiError as exc:
                results.append(ItemResult(label, exc.code, exc.message))
                continue
            records.extend(made)
            results.append(ItemResult(label))
        if validate_only or not items_ok(results):
            records = []
        return ControllerResult(records, results)

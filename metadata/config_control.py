"""Configs (Kafka's ConfigurationControlManager): incremental alters
(KIP-339) with conditions, all or nothing.  Pure: decisions only.

``min.insync.replicas`` keeps KIP-966's invariants (Kafka's KAFKA-16540):
a broker may not override it (brokers and controller must agree on which
partitions are below min ISR), and a change of a topic's value, or of the
cluster's, clears the ELR of the partitions it applies to: a replica that
was eligible under the old value may not be under the new one."""

from __future__ import annotations

from collections.abc import Sequence

from metadata import configs
from metadata.configs import ResourceType
from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.records import (
    ConfigRecord,
    PartitionChangeRecord,
    Record,
)
from metadata.requests import (
    MAX_RECORDS_PER_ATOMIC_OP,
    AlterConfigOp,
    ControllerResult,
    ItemResult,
    items_ok,
)

MIN_ISR = "min.insync.replicas"

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
                    if rtype is ResourceType.BROKER and op.key == MIN_ISR and op.value is not None:
                        raise ApiError(
                            Errors.INVALID_CONFIG,
                            f"{MIN_ISR} may not be set for one broker: set it for the cluster "
                            "or a topic (eligible leader replicas need every broker and the "
                            "controller to agree on it, KIP-966)",
                        )
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
        if items_ok(results):
            results = self._check_fetch_wait(changes, records, results)
        if validate_only or not items_ok(results):
            records = []
        clear = self._clear_elr(records)
        if len(clear) + len(records) > MAX_RECORDS_PER_ATOMIC_OP:
            raise ApiError(
                Errors.THROTTLING,
                f"changing {MIN_ISR} clears the ELR of {len(clear)} partitions, more than one "
                f"request may write ({MAX_RECORDS_PER_ATOMIC_OP})",
            )
        # The ELRs go in the same batch, first: never a new min ISR with an
        # ELR chosen under the old one.
        return ControllerResult(clear + records, results)

    def _check_fetch_wait(
        self,
        changes: Sequence[tuple[ResourceType, str, Sequence[AlterConfigOp]]],
        records: Sequence[Record],
        results: list[ItemResult],
    ) -> list[ItemResult]:
        """``results`` with each broker or cluster resource refused whose
        change of ``replica.fetch.wait.max.ms`` or ``replica.lag.time.max.ms``
        would leave the wait above the lag time for itself or, for the
        cluster, for a broker that takes either from it
        (:func:`metadata.configs.check_fetch_wait`), judged on the configs
        as the whole request leaves them."""
        watched = (configs.FETCH_WAIT, configs.LAG_TIME)
        after: dict[tuple[int, str], dict[str, str]] = {}

        def level(rtype: ResourceType, rname: str) -> dict[str, str]:
            key = (int(rtype), rname)
            if key not in after:
                after[key] = dict(self.state.image.config(key).items())
            return after[key]

        for r in records:
            if isinstance(r, ConfigRecord) and r.name in watched:
                values = level(ResourceType(r.resource_type), r.resource_name)
                if r.value is None:
                    values.pop(r.name, None)
                else:
                    values[r.name] = r.value
        cluster = level(ResourceType.CLUSTER, "")
        out = list(results)
        for i, (rtype, rname, ops) in enumerate(changes):
            if rtype is ResourceType.TOPIC or not any(op.key in watched for op in ops):
                continue
            if rtype is ResourceType.BROKER:
                brokers = [rname]
            else:
                # The cluster's default, and every broker with a value of
                # its own of either config (the others take the default's).
                brokers = [""] + sorted(
                    name
                    for (t, name), values in self.state.image.configs.items()
                    if t == int(ResourceType.BROKER) and any(k in values for k in watched)
                )
            try:
                for name in brokers:
                    configs.check_fetch_wait(
                        f"broker {name}" if name else "the cluster's default",
                        broker=level(ResourceType.BROKER, name) if name else {},
                        cluster=cluster,
                    )
            except ApiError as exc:
                out[i] = ItemResult(results[i].name, exc.code, exc.message)
        return out

    def broker_min_isr_removals(self) -> list[Record]:
        """Deletions of every broker's own min.insync.replicas, written by a
        controller taking over (Kafka removes them when the ELR is turned
        on): one left by an older log would make that broker disagree with
        the controller on which partitions are below min ISR."""
        return [
            ConfigRecord(rtype, rname, MIN_ISR, None)
            for (rtype, rname), values in sorted(self.state.image.configs.items())
            if rtype == int(ResourceType.BROKER) and MIN_ISR in values
        ]

    def _clear_elr(self, records: Sequence[Record]) -> list[Record]:
        """Changes emptying the ELR and last-known ELR of every partition
        whose min ISR ``records`` change (Kafka writes a ClearElrRecord)."""
        image = self.state.image
        topics: set[str] = set()
        for r in records:
            if not isinstance(r, ConfigRecord) or r.name != MIN_ISR:
                continue
            if image.config((r.resource_type, r.resource_name)).get(MIN_ISR) == r.value:
                continue  # unchanged
            if r.resource_type == int(ResourceType.TOPIC):
                topics.add(r.resource_name)
            elif r.resource_type == int(ResourceType.CLUSTER):
                # Every topic without a value of its own.
                topics.update(
                    t.name
                    for t in image.topics.values()
                    if MIN_ISR not in image.config((int(ResourceType.TOPIC), t.name))
                )
        out: list[Record] = []
        for name in sorted(topics):
            topic = image.topic_by_name(name)
            if topic is None:
                continue
            for i, p in enumerate(topic.partitions):
                if p.elr or p.last_known_elr:
                    out.append(PartitionChangeRecord(topic.topic_id, i, elr=(), last_known_elr=()))
        return out

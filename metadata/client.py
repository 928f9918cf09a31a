"""The Python client of kq's metadata services (``proto/kqproto/metadata.proto``).

A :class:`MetadataClient` starts from any bootstrap addresses of the
controllers and finds the active controller: it asks one bootstrap address
after another, with a cheap read (DescribeFeatures, not linearizable), which
controller is active, skipping addresses that do not answer, and then talks
to the one named.  A controller that is not (or no longer) the active one
answers NOT_CONTROLLER with the active controller's address, which the client
follows.  Every call has a deadline.

The same safety rules as :class:`quorum.driver.client.KvClient`:

* Writes (every RPC that may change metadata: CreateTopics, AlterConfigs,
  ElectLeaders, RegisterBroker, BrokerHeartbeat, ...) are sent at most once
  to a controller that may act on them.  A NOT_CONTROLLER answer is a
  definite refusal (nothing was written), so following it is safe.  If the
  RPC fails after it was sent (the controller died, the deadline passed), or
  the controller answers INDETERMINATE, the write may or may not have been
  applied: the client raises :class:`IndeterminateError` and never retries.
* Reads have no side effects and are retried, on any failure that may be
  transient, until the deadline.  A linearizable read goes to the active
  controller; ``linearizable=False`` lets any controller answer from its own,
  possibly stale, metadata image.
* A top-level error in an answer raises :class:`MetadataClientError` with the
  code (:class:`metadata.errors.Errors`) and the controller's message.
  Per-item errors (a topic of a CreateTopics, a partition of an ElectLeaders)
  are not raised: they are in the returned response, one result per item.
* No active controller before the deadline raises :class:`NoControllerError`
  (a :class:`MetadataClientError`): nothing was done.

Methods return the protobuf responses of ``kq.metadata_pb2``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc, quorum_pb2
from metadata.errors import Errors
from quorum.driver.client import LeaderFollowingClient

__all__ = [
    "AclFilter",
    "PermissionDeniedError",
    "ConfigOp",
    "ConfigResource",
    "Endpoint",
    "IndeterminateError",
    "MetadataClient",
    "MetadataClientError",
    "NewPartitions",
    "NewTopic",
    "NoControllerError",
    "PartitionChange",
    "Reassignment",
    "SupportedFeature",
    "TopicPartition",
    "acl_binding",
    "acl_name",
    "error_code",
]


class PermissionDeniedError(Exception):
    """The node refused the call (gRPC PERMISSION_DENIED): the caller's
    certificate lacks an ACL for it (docs/security.md).  Nothing was done."""


class MetadataClientError(Exception):
    """A definite failure: the request was refused and had no effect."""

    def __init__(self, code: Errors, message: str) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message


class NoControllerError(MetadataClientError):
    """No active controller answered before the deadline; nothing was done."""

    def __init__(self, message: str) -> None:
        super().__init__(Errors.REQUEST_TIMED_OUT, message)


class IndeterminateError(Exception):
    """The write may or may not have been applied.

    ``timed_out``: the client stopped waiting (the deadline passed after the
    request was sent); otherwise the controller said it could not tell, or
    the connection broke after the request left."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def error_code(value: int) -> Errors:
    """The :class:`Errors` member of a wire error code (an unknown code, from a
    newer controller, is UNKNOWN_SERVER_ERROR)."""
    try:
        return Errors(value)
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


# -- request items ------------------------------------------------------------


def _assignments(replicas: Mapping[int, Sequence[int]]) -> list[metadata_pb2.ReplicaAssignment]:
    return [
        metadata_pb2.ReplicaAssignment(partition=p, replicas=list(r))
        for p, r in sorted(replicas.items())
    ]


@dataclass(frozen=True)
class NewTopic:
    """A topic to create.  -1: the cluster's default (num.partitions,
    default.replication.factor); with ``assignments`` (partition -> broker
    ids, the first the preferred leader) both must be -1."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: Mapping[int, Sequence[int]] = field(default_factory=dict)
    configs: Mapping[str, str] = field(default_factory=dict)

    def to_proto(self) -> metadata_pb2.CreatableTopic:
        return metadata_pb2.CreatableTopic(
            name=self.name,
            num_partitions=self.num_partitions,
            replication_factor=self.replication_factor,
            assignments=_assignments(self.assignments),
            configs=dict(self.configs),
        )


@dataclass(frozen=True)
class NewPartitions:
    """Grow ``topic`` to ``total_count`` partitions; ``assignments`` may place
    the new partitions (partition -> broker ids)."""

    topic: str
    total_count: int
    assignments: Mapping[int, Sequence[int]] = field(default_factory=dict)

    def to_proto(self) -> metadata_pb2.CreatePartitionsTopic:
        return metadata_pb2.CreatePartitionsTopic(
            name=self.topic, count=self.total_count, assignments=_assignments(self.assignments)
        )


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """What configs belong to: the cluster (name ""), a broker (its id in
    decimal) or a topic (its name)."""

    type: metadata_pb2.ConfigResourceType
    name: str = ""

    @classmethod
    def cluster(cls) -> ConfigResource:
        return cls(metadata_pb2.CLUSTER, "")

    @classmethod
    def broker(cls, broker_id: int) -> ConfigResource:
        return cls(metadata_pb2.BROKER, str(broker_id))

    @classmethod
    def topic(cls, name: str) -> ConfigResource:
        return cls(metadata_pb2.TOPIC, name)

    def to_proto(self) -> metadata_pb2.ConfigResource:
        return metadata_pb2.ConfigResource(type=self.type, name=self.name)


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """Set ``key`` to ``value`` (None: delete the resource's own value),
    optionally only if its current value on the resource is ``expected`` or,
    with ``expect_absent``, if it has none."""

    key: str
    value: str | None
    expected: str | None = None
    expect_absent: bool = False

    def to_proto(self) -> metadata_pb2.AlterConfigOp:
        return metadata_pb2.AlterConfigOp(
            key=self.key,
            op=metadata_pb2.DELETE if self.value is None else metadata_pb2.SET,
            value=self.value or "",
            has_expected=self.expected is not None,
            expected_value=self.expected or "",
            expect_absent=self.expect_absent,
        )


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def to_proto(self) -> metadata_pb2.TopicPartition:
        return metadata_pb2.TopicPartition(topic=self.topic, partition=self.partition)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class Reassignment:
    """Move a partition to ``replicas`` (preference order); None cancels the
    reassignment in progress."""

    topic: str
    partition: int
    replicas: Sequence[int] | None

    def to_proto(self) -> metadata_pb2.ReassignablePartition:
        return metadata_pb2.ReassignablePartition(
            topic=self.topic, partition=self.partition, replicas=list(self.replicas or ())
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A listener of a broker."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    def to_proto(self) -> metadata_pb2.Endpoint:
        return metadata_pb2.Endpoint(
            name=self.name, host=self.host, port=self.port, security_protocol=self.security_protocol
        )


@dataclass(frozen=True, slots=True)
class SupportedFeature:
    name: str
    min_version: int
    max_version: int

    def to_proto(self) -> metadata_pb2.SupportedFeature:
        return metadata_pb2.SupportedFeature(
            name=self.name, min_version=self.min_version, max_version=self.max_version
        )


def acl_binding(
    resource_type: str,
    resource_name: str,
    principal: str,
    operation: str,
    permission: str = "ALLOW",
    *,
    host: str = "*",
    pattern_type: str = "LITERAL",
) -> metadata_pb2.AclBinding:
    """A binding from Kafka's names (``"TOPIC"``, ``"READ"``, ``"ALLOW"``,
    ``"PREFIXED"``); ValueError for a name that is none."""
    return metadata_pb2.AclBinding(
        resource_type=_acl_value(metadata_pb2.AclResourceType, "ACL_RESOURCE_", resource_type),
        resource_name=resource_name,
        pattern_type=_acl_value(metadata_pb2.AclPatternType, "ACL_PATTERN_", pattern_type),
        principal=principal,
        host=host,
        operation=_acl_value(metadata_pb2.AclOperation, "ACL_OPERATION_", operation),
        permission=_acl_value(metadata_pb2.AclPermissionType, "ACL_PERMISSION_", permission),
    )


def _acl_value(enum: Any, prefix: str, name: str) -> Any:
    try:
        return enum.Value(prefix + name.upper())
    except ValueError:
        known = ", ".join(n[len(prefix) :] for n in enum.keys() if not n.endswith("UNKNOWN"))  # noqa: SIM118
        raise ValueError(f"{name!r} is not one of {known}") from None


def acl_name(enum: Any, value: int) -> str:
    """Kafka's name of an ACL enum value (``TOPIC``, ``READ``, ``ALLOW``)."""
    return str(enum.Name(value)).split("_", 2)[-1]


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings (Kafka's AclBindingFilter): None and ``ANY`` match
    anything; pattern ``MATCH`` with a name finds what applies to it."""

    resource_type: str = "ANY"
    resource_name: str | None = None
    pattern_type: str = "ANY"
    principal: str | None = None
    host: str | None = None
    operation: str = "ANY"
    permission: str = "ANY"

    def to_proto(self) -> metadata_pb2.AclBindingFilter:
        out = metadata_pb2.AclBindingFilter(
            resource_type=_acl_value(
                metadata_pb2.AclResourceType, "ACL_RESOURCE_", self.resource_type
            ),
            pattern_type=_acl_value(metadata_pb2.AclPatternType, "ACL_PATTERN_", self.pattern_type),
            operation=_acl_value(metadata_pb2.AclOperation, "ACL_OPERATION_", self.operation),
            permission=_acl_value(
                metadata_pb2.AclPermissionType, "ACL_PERMISSION_", self.permission
            ),
        )
        if self.resource_name is not None:
            out.resource_name = self.resource_name
        if self.principal is not None:
            out.principal = self.principal
        if self.host is not None:
            out.host = self.host
        return out


@dataclass(frozen=True)
class PartitionChange:
    """One partition of an AlterPartition: the proposed ISR as
    ``(broker_id, broker_epoch)`` pairs, the leader included."""

    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: Sequence[tuple[int, int]]
    leader_recovered: bool = False

    def to_proto(self) -> metadata_pb2.AlterPartitionPartition:
        return metadata_pb2.AlterPartitionPartition(
            partition=self.partition,
            leader_epoch=self.leader_epoch,
            partition_epoch=self.partition_epoch,
            new_isr=[
                metadata_pb2.BrokerState(broker_id=b, broker_epoch=e) for b, e in self.new_isr
            ],
            leader_recovered=self.leader_recovered,
        )


# -- the client ---------------------------------------------------------------


class _Response(Protocol):
    """What every metadata response has."""

    @property
    def error(self) -> int: ...

    @property
    def message(self) -> str: ...

    @property
    def leader(self) -> quorum_pb2.LeaderHint: ...


R = TypeVar("R", bound=_Response)

# (address, seconds left) -> the RPC's answer.
_Call = Callable[[str, float], Awaitable[R]]

# Top-level answers to a read that may go away if asked again (elsewhere).
_TRANSIENT = frozenset(
    {
        Errors.REQUEST_TIMED_OUT,
        Errors.THROTTLING,
        Errors.INDETERMINATE,
        Errors.UNKNOWN_SERVER_ERROR,
    }
)
_PAUSE_S = 0.05
_PROBE_TIMEOUT_S = 1.0


class MetadataClient(LeaderFollowingClient):
    """Finds the active controller and calls the metadata services.

    ``timeout_s`` is every call's deadline unless the call names its own.
    Use as ``async with MetadataClient([...]) as client:`` or call
    :meth:`close`.
    """

    @property
    def controller_address(self) -> str | None:
        """The active controller's address as last learned, if any."""
        return self._leader

    # -- plumbing ----------------------------------------------------------

    def _admin(self, address: str) -> metadata_pb2_grpc.AdminServiceAsyncStub:
        return metadata_pb2_grpc.AdminServiceStub(self._channel(address))

    def _lifecycle(self, address: str) -> metadata_pb2_grpc.BrokerLifecycleServiceAsyncStub:
        return metadata_pb2_grpc.BrokerLifecycleServiceStub(self._channel(address))

    @staticmethod
    async def _pause(deadline: float) -> None:
        await asyncio.sleep(max(0.0, min(_PAUSE_S, deadline - time.monotonic())))

    @staticmethod
    def _no_controller(what: str, timeout_s: float, problems: Mapping[str, str]) -> str:
        detail = "; ".join(f"{a}: {why}" for a, why in problems.items()) or "nothing was tried"
        return f"{what}: no active controller answered within {timeout_s:g} s ({detail})"

    async def find_controller(self, timeout_s: float | None = None) -> str:
        """The active controller's address (as the controllers know it)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        problems: dict[str, str] = {}
        address = await self._locate(time.monotonic() + timeout, problems)
        if address is None:
            raise NoControllerError(self._no_controller("find_controller", timeout, problems))
        return address

    async def _locate(self, deadline: float, problems: dict[str, str]) -> str | None:
        """The active controller's address: the one known, or the one a
        bootstrap controller names; None at the deadline."""
        tried = 0
        while self._leader is None:
            if tried and tried % len(self.bootstrap) == 0:
                await self._pause(deadline)  # every address was tried: wait a little
            if time.monotonic() >= deadline:
                return None
            tried += 1
            address = self._next_bootstrap()
            if not await self._ready(address, deadline):
                problems[address] = "unreachable"
                continue
            try:
                answer: metadata_pb2.DescribeFeaturesResponse = await self._admin(
                    address
                ).DescribeFeatures(
                    metadata_pb2.DescribeFeaturesRequest(linearizable=False),
                    timeout=max(0.001, min(_PROBE_TIMEOUT_S, deadline - time.monotonic())),
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # A caller without DESCRIBE on the cluster cannot ask
                    # where the controller is: send the request here, and
                    # follow its NOT_CONTROLLER hint (authorized alike on
                    # every controller).
                    self._leader = address
                    break
                problems[address] = _rpc_problem(exc)
                continue
            if answer.leader.leader_address:
                self._leader = answer.leader.leader_address
            else:
                problems[address] = (
                    f"knows no active controller (quorum epoch {answer.leader.epoch})"
                )
        return self._leader

    async def _write(self, what: str, call: _Call[R], timeout_s: float | None) -> R:
        """Send a write once to the active controller; follow NOT_CONTROLLER."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        problems: dict[str, str] = {}
        while True:
            address = await self._locate(deadline, problems)
            if address is None:
                raise NoControllerError(
                    self._no_controller(f"{what} was not sent", timeout, problems)
                )
            if not await self._ready(address, deadline):
                # Not connected: nothing was sent; another controller may be active.
                problems[address] = "unreachable"
                self._forget(address)
                await self._pause(deadline)
                continue
            try:
                response = await call(address, max(0.001, deadline - time.monotonic()))
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    # Refused before any handler ran: not a metadata controller.
                    problems[address] = _rpc_problem(exc)
                    self._forget(address)
                    await self._pause(deadline)
                    continue
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise MetadataClientError(Errors.INVALID_REQUEST, exc.details() or "") from None
                if code == grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionDeniedError(exc.details() or "") from None
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise MetadataClientError(Errors.THROTTLING, exc.details() or "") from None
                self._forget(address)
                raise IndeterminateError(
                    f"{what} to {address} failed after it was sent ({code.name}"
                    + (f": {exc.details()}" if exc.details() else "")
                    + "); it may or may not have been applied",
                    timed_out=code == grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
            error = error_code(response.error)
            if error is Errors.NOT_CONTROLLER:
                problems[address] = "not the active controller"
                self._follow(response.leader, address)
                if self._leader is None:
                    await self._pause(deadline)  # an election is under way
                continue
            if error is Errors.INDETERMINATE:
                self._forget(address)
                raise IndeterminateError(
                    f"{what}: {response.message or 'outcome unknown'}; "
                    "it may or may not have been applied"
                )
            self._leader = address
            if error is not Errors.NONE:
                raise MetadataClientError(error, response.message)
            return response

    async def _read(
        self, what: str, call: _Call[R], linearizable: bool, timeout_s: float | None
    ) -> R:
        """Ask until an answer or the deadline; follow NOT_CONTROLLER."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        attempt_s = max(1.0, timeout / 2)
        problems: dict[str, str] = {}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoControllerError(self._no_controller(what, timeout, problems))
            address = self._candidate()
            try:
                response = await call(address, min(remaining, attempt_s))
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise MetadataClientError(Errors.INVALID_REQUEST, exc.details() or "") from None
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    raise PermissionDeniedError(exc.details() or "") from None
                problems[address] = _rpc_problem(exc)
                self._forget(address)
                await self._pause(deadline)
                continue
            error = error_code(response.error)
            if error is Errors.NOT_CONTROLLER:
                problems[address] = "not the active controller"
                self._follow(response.leader, address)
                if self._leader is None:
                    await self._pause(deadline)
                continue
            if error in _TRANSIENT:
                problems[address] = f"{error.name}: {response.message}"
                self._forget(address)
                await self._pause(deadline)
                continue
            if linearizable:
                self._leader = address
            if error is not Errors.NONE:
                raise MetadataClientError(error, response.message)
            return response

    # -- AdminService: writes ----------------------------------------------

    async def create_topics(
        self,
        topics: Sequence[NewTopic],
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> metadata_pb2.CreateTopicsResponse:
        request = metadata_pb2.CreateTopicsRequest(
            topics=[t.to_proto() for t in topics], validate_only=validate_only
        )
        return await self._write(
            "CreateTopics", lambda a, t: self._admin(a).CreateTopics(request, timeout=t), timeout_s
        )

    async def delete_topics(
        self,
        names: Sequence[str] = (),
        *,
        topic_ids: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> metadata_pb2.DeleteTopicsResponse:
        request = metadata_pb2.DeleteTopicsRequest(names=list(names), topic_ids=list(topic_ids))
        return await self._write(
            "DeleteTopics", lambda a, t: self._admin(a).DeleteTopics(request, timeout=t), timeout_s
        )

    async def create_partitions(
        self,
        topics: Sequence[NewPartitions],
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> metadata_pb2.CreatePartitionsResponse:
        request = metadata_pb2.CreatePartitionsRequest(
            topics=[t.to_proto() for t in topics], validate_only=validate_only
        )
        return await self._write(
            "CreatePartitions",
            lambda a, t: self._admin(a).CreatePartitions(request, timeout=t),
            timeout_s,
        )

    async def alter_configs(
        self,
        changes: Mapping[ConfigResource, Sequence[ConfigOp]],
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> metadata_pb2.AlterConfigsResponse:
        """All or nothing: if any result carries an error, nothing changed."""
        request = metadata_pb2.AlterConfigsRequest(
            resources=[
                metadata_pb2.AlterConfigsResource(
                    type=resource.type, name=resource.name, ops=[op.to_proto() for op in ops]
                )
                for resource, ops in changes.items()
            ],
            validate_only=validate_only,
        )
        return await self._write(
            "AlterConfigs", lambda a, t: self._admin(a).AlterConfigs(request, timeout=t), timeout_s
        )

    async def elect_leaders(
        self,
        election_type: metadata_pb2.ElectionType,
        partitions: Sequence[TopicPartition] = (),
        *,
        timeout_s: float | None = None,
    ) -> metadata_pb2.ElectLeadersResponse:
        """``partitions`` empty: every partition the election applies to."""
        request = metadata_pb2.ElectLeadersRequest(
            type=election_type, partitions=[p.to_proto() for p in partitions]
        )
        return await self._write(
            "ElectLeaders", lambda a, t: self._admin(a).ElectLeaders(request, timeout=t), timeout_s
        )

    async def alter_partition_reassignments(
        self, reassignments: Sequence[Reassignment], *, timeout_s: float | None = None
    ) -> metadata_pb2.AlterPartitionReassignmentsResponse:
        request = metadata_pb2.AlterPartitionReassignmentsRequest(
            partitions=[r.to_proto() for r in reassignments]
        )
        return await self._write(
            "AlterPartitionReassignments",
            lambda a, t: self._admin(a).AlterPartitionReassignments(request, timeout=t),
            timeout_s,
        )

    async def unregister_broker(
        self, broker_id: int, *, timeout_s: float | None = None
    ) -> metadata_pb2.UnregisterBrokerResponse:
        request = metadata_pb2.UnregisterBrokerRequest(broker_id=broker_id)
        return await self._write(
            "UnregisterBroker",
            lambda a, t: self._admin(a).UnregisterBroker(request, timeout=t),
            timeout_s,
        )

    async def update_features(
        self,
        updates: Mapping[str, int],
        *,
        validate_only: bool = False,
        timeout_s: float | None = None,
    ) -> metadata_pb2.UpdateFeaturesResponse:
        """``updates``: feature name -> level to finalize (0 removes it)."""
        request = metadata_pb2.UpdateFeaturesRequest(
            updates=[metadata_pb2.FeatureUpdate(name=n, level=v) for n, v in updates.items()],
            validate_only=validate_only,
        )
        return await self._write(
            "UpdateFeatures",
            lambda a, t: self._admin(a).UpdateFeatures(request, timeout=t),
            timeout_s,
        )

    # -- AdminService: reads -----------------------------------------------

    async def describe_topics(
        self,
        names: Sequence[str] = (),
        *,
        linearizable: bool = True,
        timeout_s: float | None = None,
    ) -> metadata_pb2.DescribeTopicsResponse:
        """``names`` empty: every topic."""
        request = metadata_pb2.DescribeTopicsRequest(names=list(names), linearizable=linearizable)
        return await self._read(
            "DescribeTopics",
            lambda a, t: self._admin(a).DescribeTopics(request, timeout=t),
            linearizable,
            timeout_s,
        )

    async def list_topics(
        self, *, linearizable: bool = True, timeout_s: float | None = None
    ) -> metadata_pb2.ListTopicsResponse:
        request = metadata_pb2.ListTopicsRequest(linearizable=linearizable)
        return await self._read(
            "ListTopics",
            lambda a, t: self._admin(a).ListTopics(request, timeout=t),
            linearizable,
            timeout_s,
        )

    async def describe_cluster(
        self, *, linearizable: bool = True, timeout_s: float | None = None
    ) -> metadata_pb2.DescribeClusterResponse:
        request = metadata_pb2.DescribeClusterRequest(linearizable=linearizable)
        return await self._read(
            "DescribeCluster",
            lambda a, t: self._admin(a).DescribeCluster(request, timeout=t),
            linearizable,
            timeout_s,
        )

    async def describe_configs(
        self,
        resources: Sequence[ConfigResource],
        *,
        include_defaults: bool = False,
        linearizable: bool = True,
        timeout_s: float | None = None,
    ) -> metadata_pb2.DescribeConfigsResponse:
        request = metadata_pb2.DescribeConfigsRequest(
            resources=[r.to_proto() for r in resources],
            include_defaults=include_defaults,
            linearizable=linearizable,
        )
        return await self._read(
            "DescribeConfigs",
            lambda a, t: self._admin(a).DescribeConfigs(request, timeout=t),
            linearizable,
            timeout_s,
        )

    async def list_partition_reassignments(
        self,
        partitions: Sequence[TopicPartition] = (),
        *,
        linearizable: bool = True,
        timeout_s: float | None = None,
    ) -> metadata_pb2.ListPartitionReassignmentsResponse:
        """``partitions`` empty: every partition being reassigned."""
        request = metadata_pb2.ListPartitionReassignmentsRequest(
            partitions=[p.to_proto() for p in partitions], linearizable=linearizable
        )
        return await self._read(
            "ListPartitionReassignments",
            lambda a, t: self._admin(a).ListPartitionReassignments(request, timeout=t),
            linearizable,
            timeout_s,
        )

    async def describe_features(
        self, *, linearizable: bool = True, timeout_s: float | None = None
    ) -> metadata_pb2.DescribeFeaturesResponse:
        request = metadata_pb2.DescribeFeaturesRequest(linearizable=linearizable)
        return await self._read(
            "DescribeFeatures",
            lambda a, t: self._admin(a).DescribeFeatures(request, timeout=t),
            linearizable,
            timeout_s,
        )

    # -- ACLs ---------------------------------------------------------------------

    async def create_acls(
        self, bindings: Sequence[metadata_pb2.AclBinding], *, timeout_s: float | None = None
    ) -> metadata_pb2.CreateAclsResponse:
        """One result per binding (see :func:`acl_binding`)."""
        request = metadata_pb2.CreateAclsRequest(creations=list(bindings))
        return await self._write(
            "CreateAcls", lambda a, t: self._admin(a).CreateAcls(request, timeout=t), timeout_s
        )

    async def delete_acls(
        self, filters: Sequence[AclFilter], *, timeout_s: float | None = None
    ) -> metadata_pb2.DeleteAclsResponse:
        """Per filter, the bindings it deleted."""
        request = metadata_pb2.DeleteAclsRequest(filters=[f.to_proto() for f in filters])
        return await self._write(
            "DeleteAcls", lambda a, t: self._admin(a).DeleteAcls(request, timeout=t), timeout_s
        )

    async def describe_acls(
        self,
        acl_filter: AclFilter | None = None,
        *,
        linearizable: bool = True,
        timeout_s: float | None = None,
    ) -> metadata_pb2.DescribeAclsResponse:
        """The bindings ``acl_filter`` matches (every one without)."""
        request = metadata_pb2.DescribeAclsRequest(
            filter=(acl_filter or AclFilter()).to_proto(), linearizable=linearizable
        )
        return await self._read(
            "DescribeAcls",
            lambda a, t: self._admin(a).DescribeAcls(request, timeout=t),
            linearizable,
            timeout_s,
        )

    # -- BrokerLifecycleService (all writes) ----------------------------------

    async def register_broker(
        self,
        broker_id: int,
        *,
        cluster_id: str,
        incarnation_id: str,
        endpoints: Sequence[Endpoint],
        rack: str | None = None,
        features: Sequence[SupportedFeature] = (),
        previous_broker_epoch: int = -1,
        log_dirs: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> metadata_pb2.RegisterBrokerResponse:
        request = metadata_pb2.RegisterBrokerRequest(
            broker_id=broker_id,
            cluster_id=cluster_id,
            incarnation_id=incarnation_id,
            endpoints=[e.to_proto() for e in endpoints],
            features=[f.to_proto() for f in features],
            previous_broker_epoch=previous_broker_epoch,
            log_dirs=list(log_dirs),
        )
        if rack is not None:
            request.rack = rack
        return await self._write(
            "RegisterBroker",
            lambda a, t: self._lifecycle(a).RegisterBroker(request, timeout=t),
            timeout_s,
        )

    async def broker_heartbeat(
        self,
        broker_id: int,
        broker_epoch: int,
        current_metadata_offset: int,
        *,
        want_fence: bool = False,
        want_shutdown: bool = False,
        timeout_s: float | None = None,
    ) -> metadata_pb2.BrokerHeartbeatResponse:
        """A heartbeat; with ``want_shutdown``, a step of a controlled shutdown
        (repeat until ``should_shut_down``)."""
        request = metadata_pb2.BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=broker_epoch,
            current_metadata_offset=current_metadata_offset,
            want_fence=want_fence,
            want_shutdown=want_shutdown,
        )
        return await self._write(
            "BrokerHeartbeat",
            lambda a, t: self._lifecycle(a).BrokerHeartbeat(request, timeout=t),
            timeout_s,
        )

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        changes: Sequence[PartitionChange],
        *,
        timeout_s: float | None = None,
    ) -> metadata_pb2.AlterPartitionResponse:
        """Changes grouped by topic id in the request (first appearance order)."""
        topics: dict[str, list[metadata_pb2.AlterPartitionPartition]] = {}
        for change in changes:
            topics.setdefault(change.topic_id, []).append(change.to_proto())
        request = metadata_pb2.AlterPartitionRequest(
            broker_id=broker_id,
            broker_epoch=broker_epoch,
            topics=[
                metadata_pb2.AlterPartitionTopic(topic_id=topic_id, partitions=partitions)
                for topic_id, partitions in topics.items()
            ],
        )
        return await self._write(
            "AlterPartition",
            lambda a, t: self._lifecycle(a).AlterPartition(request, timeout=t),
            timeout_s,
        )

    async def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int, *, timeout_s: float | None = None
    ) -> metadata_pb2.AllocateProducerIdsResponse:
        request = metadata_pb2.AllocateProducerIdsRequest(
            broker_id=broker_id, broker_epoch=broker_epoch
        )
        return await self._write(
            "AllocateProducerIds",
            lambda a, t: self._lifecycle(a).AllocateProducerIds(request, timeout=t),
            timeout_s,
        )


def _rpc_problem(exc: grpc.aio.AioRpcError) -> str:
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return "serves no metadata service (UNIMPLEMENTED)"
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        return "unreachable"
    details = exc.details()
    return exc.code().name + (f": {details}" if details else "")

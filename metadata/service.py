"""The gRPC servicers of the metadata controller (``proto/kqproto/metadata.proto``).

:class:`AdminServicer` and :class:`BrokerLifecycleServicer` translate between
the wire and :class:`metadata.active.QuorumController`: they check each
request's shape (a malformed item is refused with INVALID_REQUEST naming the
field, never with an exception), hand the writes to the active controller's
decisions (:mod:`metadata.controller`) and answer reads from the committed
metadata image.  The contract's conventions are kept here:

* every answer carries ``error``, ``message`` and ``leader`` (this node's
  view of the active controller); a top-level error leaves the rest empty;
* batch answers hold one result per request item, in the request's order;
* a refusal is an ``error`` in the answer, never a gRPC status; anything
  unexpected is logged and answered UNKNOWN_SERVER_ERROR;
* writes wait for their records to commit, within the call's deadline
  (default 5 s); reads are linearizable on the active controller, or stale
  from any controller's own image.
"""

from __future__ import annotations

import base64
import binascii
import enum
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import grpc

from kqproto import metadata_pb2, metadata_pb2_grpc, quorum_pb2
from metadata import configs
from metadata.acl_control import describe_acls
from metadata.acls import (
    AclBindingFilter,
    AclOperation,
    AclPermission,
    AclResourceType,
    InvalidAclError,
    PatternType,
    StandardAcl,
)
from metadata.active import QuorumController
from metadata.configs import ResourceType
from metadata.controller import (
    SUPPORTED_FEATURES,
    AlterConfigOp,
    AlterPartitionItem,
    Controller,
    ControllerResult,
    HeartbeatRequest,
    ItemResult,
    NewTopic,
    RegisterRequest,
)
from metadata.errors import ApiError, Errors
from metadata.image import INTERNAL_TOPICS, MetadataImage, PartitionRegistration
from metadata.partition_change import Election
from metadata.records import Endpoint, FeatureRange, LeaderRecoveryState
from quorum.driver.plugin import (
    CLUSTER_RESOURCE,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_WRITE_TIMEOUT_S,
    IdentityRole,
    PluginHost,
    audit_refusal,
    authorize_call,
    call_timeout,
    caller_may,
    peer_host,
    peer_identity,
)
from quorum.driver.raft_client import ProposalOutcome

__all__ = [
    "AdminServicer",
    "BrokerLifecycleServicer",
    "acl_filter_from_proto",
    "acl_from_proto",
    "is_reserved_directory_id",
    "is_uuid",
    "stored_acl",
]

log = logging.getLogger("kq.metadata.service")

T = TypeVar("T")
E = TypeVar("E", bound=enum.IntEnum)

# Kafka's security protocol names (Endpoint.security_protocol).
SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_UUID_TEXT = re.compile(r"[A-Za-z0-9_-]{22}")

_SOURCES: Mapping[configs.ConfigSource, metadata_pb2.ConfigSource] = {
    configs.ConfigSource.TOPIC_CONFIG: metadata_pb2.TOPIC_CONFIG,
    configs.ConfigSource.DYNAMIC_BROKER_CONFIG: metadata_pb2.BROKER_CONFIG,
    configs.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG: metadata_pb2.CLUSTER_CONFIG,
    configs.ConfigSource.DEFAULT_CONFIG: metadata_pb2.DEFAULT_CONFIG,
}
# The source of a value set on a resource of each type.
_OWN_SOURCE: Mapping[ResourceType, metadata_pb2.ConfigSource] = {
    ResourceType.TOPIC: metadata_pb2.TOPIC_CONFIG,
    ResourceType.BROKER: metadata_pb2.BROKER_CONFIG,
    ResourceType.CLUSTER: metadata_pb2.CLUSTER_CONFIG,
}
_ELECTIONS: Mapping[int, Election] = {
    metadata_pb2.PREFERRED: Election.PREFERRED,
    metadata_pb2.UNCLEAN: Election.UNCLEAN,
}


def is_uuid(text: str) -> bool:
    """Whether ``text`` is a Kafka Uuid in its text form (16 bytes in
    URL-safe base64 without padding, canonical), other than all zeros."""
    if not _UUID_TEXT.fullmatch(text):
        return False
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):  # pragma: no cover - the pattern admits only base64
        return False
    canonical = base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == text
    return len(raw) == 16 and canonical and any(raw)


def is_reserved_directory_id(text: str) -> bool:
    """Whether ``text`` (a Uuid) is one of the directory ids Kafka reserves
    (``DirectoryId``: all but the last byte zero and that byte below 100;
    UNASSIGNED, LOST and MIGRATING among them)."""
    raw = base64.urlsafe_b64decode(text + "==")
    return not any(raw[:15]) and raw[15] < 100


def _wire(code: Errors) -> metadata_pb2.MetadataError:
    return cast(metadata_pb2.MetadataError, int(code))


def _invalid(message: str) -> ApiError:
    return ApiError(Errors.INVALID_REQUEST, message)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise _invalid(message)


def _repeated(keys: Sequence[T]) -> set[T]:
    """The keys that occur more than once."""
    return {k for k, n in Counter(keys).items() if n > 1}


class _Response(Protocol):
    """What every metadata response has."""

    error: metadata_pb2.MetadataError
    message: str

    @property
    def leader(self) -> quorum_pb2.LeaderHint: ...


R = TypeVar("R", bound=_Response)


class _Servicer:
    """What both servicers share: answers, writes and reads."""

    def __init__(self, controller: QuorumController, server: PluginHost) -> None:
        self.controller = controller
        self.server = server

    async def answer(self, rpc: str, make: Callable[[], R], body: Callable[[], Awaitable[R]]) -> R:
        """``body()``'s answer; a refusal (ApiError) or an unexpected error
        as a top-level error.  Fills in the leader hint."""
        try:
            response = await body()
        except ApiError as exc:
            response = make()
            response.error = _wire(exc.code)
            response.message = exc.message
        except Exception as exc:
            log.exception("node %d: %s failed", self.server.node_id, rpc)
            response = make()
            response.error = _wire(Errors.UNKNOWN_SERVER_ERROR)
            response.message = f"{rpc} failed in the controller: {type(exc).__name__}: {exc}"
        response.leader.CopyFrom(self.server.leader_hint())
        return response

    async def write(self, context: Any, decide: Callable[[Controller], ControllerResult[T]]) -> T:
        return await self.controller.write(decide, call_timeout(context, DEFAULT_WRITE_TIMEOUT_S))

    async def write_at(
        self, context: Any, decide: Callable[[Controller], ControllerResult[T]]
    ) -> tuple[T, ProposalOutcome | None]:
        return await self.controller.write_at(
            decide, call_timeout(context, DEFAULT_WRITE_TIMEOUT_S)
        )

    async def read(self, context: Any, linearizable: bool) -> MetadataImage:
        return await self.controller.read(
            linearizable, call_timeout(context, DEFAULT_READ_TIMEOUT_S)
        )

    def now_ms(self) -> int:
        return self.server.raft.now_ms()

    # -- authorization (docs/security.md): before the answer's body, whose
    # catch-all would turn the abort into an error answer.

    async def authorize(
        self,
        context: Any,
        method: str,
        operation: str,
        resource_type: str = "CLUSTER",
        resource_name: str = CLUSTER_RESOURCE,
    ) -> None:
        await authorize_call(self.server, context, method, operation, resource_type, resource_name)

    def may(self, context: Any, operation: str, resource_type: str) -> Callable[[str], bool]:
        return caller_may(self.server, context, operation, resource_type)

    async def authorize_topics(
        self,
        context: Any,
        method: str,
        operation: str,
        names: Iterable[str],
        cluster_wide: bool = False,
    ) -> None:
        """``operation`` on each topic; with ``cluster_wide``, the operation
        on the cluster covers them all (Kafka's CreateTopics: CREATE on the
        cluster, or on each topic)."""
        if cluster_wide and self.may(context, operation, "CLUSTER")(CLUSTER_RESOURCE):
            return
        for name in dict.fromkeys(names):
            await self.authorize(context, method, operation, "TOPIC", name)

    async def authorize_configs(
        self,
        context: Any,
        method: str,
        operation: str,
        resources: Iterable[metadata_pb2.ConfigResource | metadata_pb2.AlterConfigsResource],
    ) -> None:
        """A topic's configs are the topic's; a broker's and the cluster's
        are the cluster's (Kafka's broker configs are CLUSTER resources)."""
        for r in resources:
            if r.type == metadata_pb2.TOPIC:
                await self.authorize(context, method, operation, "TOPIC", r.name)
            else:
                await self.authorize(context, method, operation)


# -- request checks ---------------------------------------------------------------


def _replicas(field: str, replicas: Iterable[int]) -> tuple[int, ...]:
    out = tuple(replicas)
    for b in out:
        _check(b >= 0, f"{field}: broker id {b} is negative")
    return out


def _new_topic(i: int, t: metadata_pb2.CreatableTopic) -> NewTopic:
    at = f"topics[{i}]"
    assignments: dict[int, tuple[int, ...]] = {}
    for a in t.assignments:
        if a.partition in assignments:
            raise ApiError(
                Errors.INVALID_REPLICA_ASSIGNMENT,
                f"{at}.assignments: partition {a.partition} is assigned twice",
            )
        assignments[a.partition] = _replicas(
            f"{at}.assignments (partition {a.partition})", a.replicas
        )
    if assignments and (t.num_partitions != -1 or t.replication_factor != -1):
        raise _invalid(
            f"{at}: num_partitions and replication_factor must be -1 with explicit assignments"
            f" (not {t.num_partitions} and {t.replication_factor})"
        )
    return NewTopic(t.name, t.num_partitions, t.replication_factor, assignments, dict(t.configs))


def _resource_type(field: str, value: int) -> ResourceType:
    try:
        return ResourceType(value)
    except ValueError:
        raise _invalid(f"{field}: unknown config resource type {value}") from None


def _topic_partition(field: str, topic: str, partition: int) -> tuple[str, int]:
    _check(bool(topic), f"{field}.topic must not be empty")
    _check(partition >= 0, f"{field}.partition {partition} is negative")
    return topic, partition


def _endpoint(i: int, e: metadata_pb2.Endpoint) -> Endpoint:
    at = f"endpoints[{i}]"
    _check(bool(e.name), f"{at}.name must not be empty")
    _check(bool(e.host), f"{at}.host must not be empty")
    _check(1 <= e.port <= 65535, f"{at}.port {e.port} is not in 1..65535")
    _check(
        e.security_protocol in SECURITY_PROTOCOLS,
        f"{at}.security_protocol {e.security_protocol!r} is not one of "
        + ", ".join(sorted(SECURITY_PROTOCOLS)),
    )
    return Endpoint(e.name, e.host, e.port, e.security_protocol)


def _feature_range(i: int, f: metadata_pb2.SupportedFeature) -> FeatureRange:
    at = f"features[{i}]"
    _check(bool(f.name), f"{at}.name must not be empty")
    _check(
        0 <= f.min_version <= f.max_version,
        f"{at}: the range {f.min_version}..{f.max_version} of {f.name} is not a range of levels",
    )
    return FeatureRange(f.name, f.min_version, f.max_version)


def _register_request(r: metadata_pb2.RegisterBrokerRequest) -> RegisterRequest:
    _check(r.broker_id >= 0, f"broker_id {r.broker_id} is negative")
    _check(bool(r.cluster_id), "cluster_id must not be empty")
    _check(
        is_uuid(r.incarnation_id),
        f"incarnation_id {r.incarnation_id!r} is not a Uuid (22 characters of URL-safe"
        " base64, not all zeros)",
    )
    _check(len(r.endpoints) > 0, "endpoints: a broker needs at least one listener")
    endpoints = tuple(_endpoint(i, e) for i, e in enumerate(r.endpoints))
    twice = _repeated([e.name for e in endpoints])
    _check(not twice, f"endpoints: listener names {sorted(twice)} are used twice")
    features = tuple(_feature_range(i, f) for i, f in enumerate(r.features))
    twice = _repeated([f.name for f in features])
    _check(not twice, f"features: {sorted(twice)} are listed twice")
    rack: str | None = None
    if r.HasField("rack"):
        _check(bool(r.rack), "rack must not be empty when given")
        rack = r.rack
    _check(
        r.previous_broker_epoch >= -1,
        f"previous_broker_epoch {r.previous_broker_epoch} is neither an epoch nor -1",
    )
    for i, directory in enumerate(r.log_dirs):
        _check(
            is_uuid(directory) and not is_reserved_directory_id(directory),
            f"log_dirs[{i}] {directory!r} is not a directory id (a Uuid, not one of the "
            "hundred reserved ones)",
        )
    twice = _repeated(list(r.log_dirs))
    _check(not twice, f"log_dirs: {sorted(twice)} are listed twice")
    return RegisterRequest(
        r.broker_id,
        r.cluster_id,
        r.incarnation_id,
        endpoints,
        rack,
        features,
        r.previous_broker_epoch,
        tuple(r.log_dirs),
    )


def _broker_and_epoch(broker_id: int, broker_epoch: int) -> None:
    _check(broker_id >= 0, f"broker_id {broker_id} is negative")
    _check(broker_epoch >= 0, f"broker_epoch {broker_epoch} is negative")


def _item_error(error: Errors, message: str) -> ItemResult:
    return ItemResult("", error, message)


def _outcome(checked: object, decided: Iterator[ItemResult]) -> ItemResult:
    """An item's result: its refusal if the check refused it, else the next
    of the results the controller decided (for the items that passed)."""
    if isinstance(checked, ApiError):
        return _item_error(checked.code, checked.message)
    return next(decided)


# -- answers from the image ---------------------------------------------------------


def _partition_description(
    image: MetadataImage, i: int, p: PartitionRegistration
) -> metadata_pb2.PartitionDescription:
    return metadata_pb2.PartitionDescription(
        partition=i,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        replicas=p.replicas,
        isr=p.isr,
        adding_replicas=p.adding_replicas,
        removing_replicas=p.removing_replicas,
        leader_recovering=p.leader_recovery_state is LeaderRecoveryState.RECOVERING,
        eligible_leader_replicas=p.elr,
        last_known_elr=p.last_known_elr,
        offline_replicas=image.offline_replicas(p),
    )


def _topic_description(image: MetadataImage, topic_id: str) -> metadata_pb2.TopicDescription:
    topic = image.topics[topic_id]
    return metadata_pb2.TopicDescription(
        name=topic.name,
        topic_id=topic.topic_id,
        error=_wire(Errors.NONE),
        partitions=[_partition_description(image, i, p) for i, p in enumerate(topic.partitions)],
        configs=dict(image.config((int(ResourceType.TOPIC), topic.name)).items()),
    )


def describe_config_entries(
    image: MetadataImage, rtype: ResourceType, name: str, include_defaults: bool
) -> list[metadata_pb2.ConfigEntry]:
    """The config entries of one resource: its own values, or (with
    ``include_defaults``) every config that applies to it with the value in
    force and where it comes from.  By name."""
    own = image.config((int(rtype), name))
    if not include_defaults:
        return [
            metadata_pb2.ConfigEntry(name=key, value=value, source=_OWN_SOURCE[rtype])
            for key, value in sorted(own.items())
        ]
    cluster = image.config((int(ResourceType.CLUSTER), ""))
    entries = []
    for key in sorted(configs.describe_defaults(rtype)):
        if rtype is ResourceType.TOPIC:
            resolved = configs.resolve(key, topic=own, cluster=cluster)
        elif rtype is ResourceType.BROKER:
            resolved = configs.resolve(key, broker=own, cluster=cluster)
        else:
            resolved = configs.resolve(key, cluster=own)
        entries.append(
            metadata_pb2.ConfigEntry(
                name=key, value=resolved.value, source=_SOURCES[resolved.source]
            )
        )
    return entries


def feature_descriptions(image: MetadataImage) -> list[metadata_pb2.FeatureDescription]:
    """Every known feature: the levels this controller and every registered
    broker support (a broker that does not list a feature supports only
    level 0), and the finalized level."""
    out = []
    for name in sorted(set(SUPPORTED_FEATURES) | set(image.features.keys())):
        low, high = SUPPORTED_FEATURES.get(name, (0, 0))
        for b in image.brokers.values():
            ranges = {f.name: f for f in b.features}
            f = ranges.get(name)
            low = max(low, f.min_level if f is not None else 0)
            high = min(high, f.max_level if f is not None else 0)
        out.append(
            metadata_pb2.FeatureDescription(
                name=name,
                supported_min_version=low,
                supported_max_version=high,
                finalized_level=image.features.get(name, 0),
            )
        )
    return out


def _ongoing(
    image: MetadataImage, wanted: set[tuple[str, int]] | None
) -> list[metadata_pb2.OngoingReassignment]:
    out = []
    for topic, i, p in image.partitions():
        if p.is_reassigning and (wanted is None or (topic.name, i) in wanted):
            out.append(
                metadata_pb2.OngoingReassignment(
                    topic=topic.name,
                    partition=i,
                    replicas=p.replicas,
                    adding_replicas=p.adding_replicas,
                    removing_replicas=p.removing_replicas,
                )
            )
    out.sort(key=lambda r: (r.topic, r.partition))
    return out


def _conditions_failed(
    image: MetadataImage, rtype: ResourceType, name: str, ops: Sequence[AlterConfigOp]
) -> list[metadata_pb2.CurrentConfigValue]:
    """The keys of ``ops`` whose condition does not hold on ``image``, with
    the value found."""
    current = image.config((int(rtype), name))
    out = []
    for op in ops:
        if not op.conditional:
            continue
        found = current.get(op.key)
        holds = found is None if op.expect_absent else found == op.expected
        if not holds:
            out.append(
                metadata_pb2.CurrentConfigValue(
                    key=op.key, present=found is not None, value=found or ""
                )
            )
    return out


# -- AdminService -----------------------------------------------------------------------


class AdminServicer(metadata_pb2_grpc.AdminServiceServicer):
    """kq.metadata.AdminService on one controller node."""

    def __init__(self, controller: QuorumController, server: PluginHost) -> None:
        self._s = _Servicer(controller, server)

    # -- topics -------------------------------------------------------------------

    async def CreateTopics(
        self, request: metadata_pb2.CreateTopicsRequest, context: Any
    ) -> metadata_pb2.CreateTopicsResponse:
        caller = peer_identity(context)
        names = [t.name for t in request.topics]
        internal = bool(names) and all(name in INTERNAL_TOPICS for name in names)
        if not (internal and caller is not None and caller.role is IdentityRole.BROKER):
            # A broker creates the cluster's internal topics on first use
            # (Kafka's AutoTopicCreationManager, under the broker's own
            # principal); everything else needs CREATE.
            await self._s.authorize_topics(
                context, "CreateTopics", "CREATE", names, cluster_wide=True
            )

        async def body() -> metadata_pb2.CreateTopicsResponse:
            twice = _repeated([t.name for t in request.topics])
            checked: list[NewTopic | ApiError] = []
            for i, t in enumerate(request.topics):
                if t.name in twice:
                    checked.append(
                        _invalid(
                            f"topics[{i}]: topic {t.name!r} is listed more than once; "
                            "none of its entries is created"
                        )
                    )
                    continue
                try:
                    checked.append(_new_topic(i, t))
                except ApiError as exc:
                    checked.append(exc)
            valid = [t for t in checked if isinstance(t, NewTopic)]
            validate_only = request.validate_only

            def decide(
                c: Controller,
            ) -> ControllerResult[tuple[list[ItemResult], dict[str, str]]]:
                made = c.create_topics(valid, validate_only)
                existing = {
                    r.name: c.image.topic_ids.get(r.name, "")
                    for r in made.response
                    if r.error is Errors.TOPIC_ALREADY_EXISTS
                }
                return ControllerResult(made.records, (made.response, existing), made.atomic)

            results, existing = await self._s.write(context, decide)
            done = iter(results)
            out = metadata_pb2.CreateTopicsResponse(error=_wire(Errors.NONE))
            for t, item in zip(request.topics, checked, strict=True):
                r = _outcome(item, done)
                result = metadata_pb2.CreatableTopicResult(
                    name=t.name, error=_wire(r.error), message=r.message
                )
                if r.error is Errors.NONE:
                    result.num_partitions = r.num_partitions
                    result.replication_factor = r.replication_factor
                    if not validate_only:
                        result.topic_id = r.topic_id
                elif r.error is Errors.TOPIC_ALREADY_EXISTS:
                    result.topic_id = existing.get(t.name, "")
                out.topics.append(result)
            return out

        return await self._s.answer("CreateTopics", metadata_pb2.CreateTopicsResponse, body)

    async def DeleteTopics(
        self, request: metadata_pb2.DeleteTopicsRequest, context: Any
    ) -> metadata_pb2.DeleteTopicsResponse:
        image = self._s.controller.committed_image()
        named = list(request.names) + [
            image.topics[i].name for i in request.topic_ids if i in image.topics
        ]
        await self._s.authorize_topics(context, "DeleteTopics", "DELETE", named)

        async def body() -> metadata_pb2.DeleteTopicsResponse:
            malformed: dict[int, ApiError] = {}
            entries: list[tuple[str, str]] = []  # ("name" | "id", value)
            for i, name in enumerate(request.names):
                entries.append(("name", name))
                if not name:
                    malformed[len(entries) - 1] = _invalid(f"names[{i}] must not be empty")
            for i, topic_id in enumerate(request.topic_ids):
                entries.append(("id", topic_id))
                if not is_uuid(topic_id):
                    malformed[len(entries) - 1] = _invalid(
                        f"topic_ids[{i}]: {topic_id!r} is not a topic id"
                    )

            def decide(
                c: Controller,
            ) -> ControllerResult[list[tuple[str, str, ItemResult]]]:
                image = c.image
                # Each entry's topic (name, id) as far as known.
                known: list[tuple[str, str]] = []
                for kind, value in entries:
                    if kind == "name":
                        known.append((value, image.topic_ids.get(value, "")))
                    else:
                        topic = image.topics.get(value)
                        known.append((topic.name if topic is not None else "", value))
                twice = _repeated(
                    [tid for k, (_, tid) in enumerate(known) if tid and k not in malformed]
                )
                names: list[str] = []
                ids: list[str] = []
                for k, ((kind, value), (_, tid)) in enumerate(zip(entries, known, strict=True)):
                    if k in malformed or tid in twice:
                        continue
                    (names if kind == "name" else ids).append(value)
                deleted = c.delete_topics(names, ids)
                results = iter(deleted.response)
                out: list[tuple[str, str, ItemResult]] = []
                for k, (name, tid) in enumerate(known):
                    if k in malformed:
                        exc = malformed[k]
                        out.append((name, tid, _item_error(exc.code, exc.message)))
                    elif tid in twice:
                        message = (
                            f"topic {name or tid} is named more than once in the request; "
                            "it is not deleted"
                        )
                        out.append((name, tid, _item_error(Errors.INVALID_REQUEST, message)))
                    else:
                        out.append((name, tid, next(results)))
                return ControllerResult(deleted.records, out, deleted.atomic)

            results = await self._s.write(context, decide)
            return metadata_pb2.DeleteTopicsResponse(
                error=_wire(Errors.NONE),
                topics=[
                    metadata_pb2.DeletableTopicResult(
                        name=name, topic_id=tid, error=_wire(r.error), message=r.message
                    )
                    for name, tid, r in results
                ],
            )

        return await self._s.answer("DeleteTopics", metadata_pb2.DeleteTopicsResponse, body)

    async def CreatePartitions(
        self, request: metadata_pb2.CreatePartitionsRequest, context: Any
    ) -> metadata_pb2.CreatePartitionsResponse:
        await self._s.authorize_topics(
            context, "CreatePartitions", "ALTER", [t.name for t in request.topics]
        )

        async def body() -> metadata_pb2.CreatePartitionsResponse:
            twice = _repeated([t.name for t in request.topics])
            validate_only = request.validate_only
            topics = list(request.topics)

            def one(
                c: Controller, i: int, t: metadata_pb2.CreatePartitionsTopic
            ) -> ControllerResult[ItemResult]:
                at = f"topics[{i}]"
                _check(bool(t.name), f"{at}.name must not be empty")
                _check(
                    t.name not in twice,
                    f"{at}: topic {t.name} is listed more than once; none of its entries is done",
                )
                topic = c.image.topic_by_name(t.name)
                if topic is None:
                    raise ApiError(
                        Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name} does not exist"
                    )
                placed: dict[int, tuple[int, ...]] = {}
                current = len(topic.partitions)
                rf = len(topic.partitions[0].target_replicas()) if topic.partitions else 0
                # (a count that is not larger is the controller's refusal)
                for a in t.assignments if t.count > current else ():
                    where = f"{at}.assignments (partition {a.partition})"
                    replicas = _replicas(where, a.replicas)
                    if a.partition in placed or not current <= a.partition < t.count:
                        raise ApiError(
                            Errors.INVALID_REPLICA_ASSIGNMENT,
                            f"{where}: the assignments must name each new partition "
                            f"{current}..{t.count - 1} once",
                        )
                    if len(replicas) != rf:
                        raise ApiError(
                            Errors.INVALID_REPLICA_ASSIGNMENT,
                            f"{where}: {len(replicas)} replicas {list(replicas)}, but topic "
                            f"{t.name} has replication factor {rf}",
                        )
                    placed[a.partition] = replicas
                if placed and len(placed) != t.count - current:
                    raise ApiError(
                        Errors.INVALID_REPLICA_ASSIGNMENT,
                        f"{at}.assignments: {len(placed)} partitions placed, but going from "
                        f"{current} to {t.count} partitions adds {t.count - current}",
                    )
                assignment = [placed[p] for p in sorted(placed)]
                return c.create_partitions(t.name, t.count, assignment, validate_only)

            def decide(c: Controller) -> ControllerResult[list[ItemResult]]:
                records = []
                results = []
                for i, t in enumerate(topics):
                    try:
                        made = one(c, i, t)
                    except ApiError as exc:
                        results.append(_item_error(exc.code, exc.message))
                        continue
                    records.extend(made.records)
                    results.append(made.response)
                return ControllerResult(records, results)

            results = await self._s.write(context, decide)
            return metadata_pb2.CreatePartitionsResponse(
                error=_wire(Errors.NONE),
                topics=[
                    metadata_pb2.CreatePartitionsTopicResult(
                        name=t.name, error=_wire(r.error), message=r.message
                    )
                    for t, r in zip(topics, results, strict=True)
                ],
            )

        return await self._s.answer("CreatePartitions", metadata_pb2.CreatePartitionsResponse, body)

    async def DescribeTopics(
        self, request: metadata_pb2.DescribeTopicsRequest, context: Any
    ) -> metadata_pb2.DescribeTopicsResponse:
        await self._s.authorize_topics(context, "DescribeTopics", "DESCRIBE", request.names)

        async def body() -> metadata_pb2.DescribeTopicsResponse:
            image = await self._s.read(context, request.linearizable)
            out = metadata_pb2.DescribeTopicsResponse(
                error=_wire(Errors.NONE), metadata_offset=image.offset
            )
            if not request.names:
                # Every topic the caller may describe (Kafka's Metadata).
                may_describe = self._s.may(context, "DESCRIBE", "TOPIC")
                for name, topic_id in sorted(image.topic_ids.items()):
                    if may_describe(name):
                        out.topics.append(_topic_description(image, topic_id))
                return out
            for i, name in enumerate(request.names):
                found = image.topic_ids.get(name)
                if found is not None:
                    out.topics.append(_topic_description(image, found))
                    continue
                error, message = (
                    (Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name} does not exist")
                    if name
                    else (Errors.INVALID_REQUEST, f"names[{i}] must not be empty")
                )
                out.topics.append(
                    metadata_pb2.TopicDescription(name=name, error=_wire(error), message=message)
                )
            return out

        return await self._s.answer("DescribeTopics", metadata_pb2.DescribeTopicsResponse, body)

    async def ListTopics(
        self, request: metadata_pb2.ListTopicsRequest, context: Any
    ) -> metadata_pb2.ListTopicsResponse:
        async def body() -> metadata_pb2.ListTopicsResponse:
            image = await self._s.read(context, request.linearizable)
            may_describe = self._s.may(context, "DESCRIBE", "TOPIC")
            return metadata_pb2.ListTopicsResponse(
                error=_wire(Errors.NONE),
                # Only the topics the caller may describe (Kafka's Metadata).
                topics=[
                    metadata_pb2.TopicListing(name=name, topic_id=topic_id)
                    for name, topic_id in sorted(image.topic_ids.items())
                    if may_describe(name)
                ],
                metadata_offset=image.offset,
            )

        return await self._s.answer("ListTopics", metadata_pb2.ListTopicsResponse, body)

    # -- cluster ------------------------------------------------------------------

    async def DescribeCluster(
        self, request: metadata_pb2.DescribeClusterRequest, context: Any
    ) -> metadata_pb2.DescribeClusterResponse:
        await self._s.authorize(context, "DescribeCluster", "DESCRIBE")

        async def body() -> metadata_pb2.DescribeClusterResponse:
            image = await self._s.read(context, request.linearizable)
            out = metadata_pb2.DescribeClusterResponse(
                error=_wire(Errors.NONE),
                cluster_id=self._s.controller.options.cluster_id,
                controller_id=self._s.server.leader_hint().leader_id,
                features=[
                    metadata_pb2.FinalizedFeature(name=name, level=level)
                    for name, level in sorted(image.features.items())
                ],
                metadata_offset=image.offset,
            )
            for _, b in sorted(image.brokers.items()):
                described = metadata_pb2.BrokerDescription(
                    broker_id=b.broker_id,
                    incarnation_id=b.incarnation_id,
                    broker_epoch=b.epoch,
                    endpoints=[
                        metadata_pb2.Endpoint(
                            name=e.name,
                            host=e.host,
                            port=e.port,
                            security_protocol=e.security_protocol,
                        )
                        for e in b.endpoints
                    ],
                    fenced=b.fenced,
                    in_controlled_shutdown=b.in_controlled_shutdown,
                    log_dirs=list(b.log_dirs),
                )
                if b.rack is not None:
                    described.rack = b.rack
                out.brokers.append(described)
            return out

        return await self._s.answer("DescribeCluster", metadata_pb2.DescribeClusterResponse, body)

    async def UnregisterBroker(
        self, request: metadata_pb2.UnregisterBrokerRequest, context: Any
    ) -> metadata_pb2.UnregisterBrokerResponse:
        await self._s.authorize(context, "UnregisterBroker", "ALTER")

        async def body() -> metadata_pb2.UnregisterBrokerResponse:
            broker_id = request.broker_id
            _check(broker_id >= 0, f"broker_id {broker_id} is negative")
            await self._s.write(context, lambda c: c.unregister_broker(broker_id))
            return metadata_pb2.UnregisterBrokerResponse(error=_wire(Errors.NONE))

        return await self._s.answer("UnregisterBroker", metadata_pb2.UnregisterBrokerResponse, body)

    # -- configs ------------------------------------------------------------------

    async def DescribeConfigs(
        self, request: metadata_pb2.DescribeConfigsRequest, context: Any
    ) -> metadata_pb2.DescribeConfigsResponse:
        await self._s.authorize_configs(
            context, "DescribeConfigs", "DESCRIBE_CONFIGS", request.resources
        )

        async def body() -> metadata_pb2.DescribeConfigsResponse:
            image = await self._s.read(context, request.linearizable)
            twice = _repeated([(int(r.type), r.name) for r in request.resources])
            out = metadata_pb2.DescribeConfigsResponse(
                error=_wire(Errors.NONE), metadata_offset=image.offset
            )
            for i, r in enumerate(request.resources):
                result = metadata_pb2.DescribeConfigsResult(type=r.type, name=r.name)
                try:
                    rtype = _resource_type(f"resources[{i}].type", r.type)
                    _check(
                        (int(r.type), r.name) not in twice,
                        f"resources[{i}]: the resource is listed more than once",
                    )
                    configs.validate_resource(rtype, r.name)
                    if rtype is ResourceType.TOPIC and r.name not in image.topic_ids:
                        raise ApiError(
                            Errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {r.name} does not exist"
                        )
                    result.entries.extend(
                        describe_config_entries(image, rtype, r.name, request.include_defaults)
                    )
                    result.error = _wire(Errors.NONE)
                except ApiError as exc:
                    result.error = _wire(exc.code)
                    result.message = exc.message
                out.results.append(result)
            return out

        return await self._s.answer("DescribeConfigs", metadata_pb2.DescribeConfigsResponse, body)

    async def AlterConfigs(
        self, request: metadata_pb2.AlterConfigsRequest, context: Any
    ) -> metadata_pb2.AlterConfigsResponse:
        await self._s.authorize_configs(context, "AlterConfigs", "ALTER_CONFIGS", request.resources)

        async def body() -> metadata_pb2.AlterConfigsResponse:
            twice = _repeated([(int(r.type), r.name) for r in request.resources])
            checked: list[tuple[ResourceType, str, list[AlterConfigOp]] | ApiError] = []
            for i, r in enumerate(request.resources):
                try:
                    checked.append(_alter_configs_resource(i, r, twice))
                except ApiError as exc:
                    checked.append(exc)
            valid = [c for c in checked if not isinstance(c, ApiError)]
            malformed = len(valid) < len(checked)
            validate_only = request.validate_only

            def decide(
                c: Controller,
            ) -> ControllerResult[list[tuple[ItemResult, list[metadata_pb2.CurrentConfigValue]]]]:
                made = c.alter_configs(valid, validate_only)
                out = []
                for (rtype, name, ops), r in zip(valid, made.response, strict=True):
                    current = []
                    if r.error is Errors.CONFIG_PRECONDITION_FAILED:
                        current = _conditions_failed(c.image, rtype, name, ops)
                    out.append((r, current))
                # All or nothing: any error anywhere, and nothing is written.
                failed = malformed or any(r.error is not Errors.NONE for r in made.response)
                return ControllerResult([] if failed else made.records, out)

            answers, committed = await self._s.write_at(context, decide)
            results = iter(answers)
            response = metadata_pb2.AlterConfigsResponse(error=_wire(Errors.NONE))
            if committed is not None:
                response.position.offset = committed.offset
                response.position.epoch = committed.epoch
            for r, item in zip(request.resources, checked, strict=True):
                result = metadata_pb2.AlterConfigsResult(type=r.type, name=r.name)
                if isinstance(item, ApiError):
                    result.error = _wire(item.code)
                    result.message = item.message
                else:
                    found, current = next(results)
                    result.error = _wire(found.error)
                    result.message = found.message
                    result.current.extend(current)
                response.results.append(result)
            return response

        return await self._s.answer("AlterConfigs", metadata_pb2.AlterConfigsResponse, body)

    # -- leaders and replicas -------------------------------------------------------

    async def ElectLeaders(
        self, request: metadata_pb2.ElectLeadersRequest, context: Any
    ) -> metadata_pb2.ElectLeadersResponse:
        await self._s.authorize(context, "ElectLeaders", "ALTER")

        async def body() -> metadata_pb2.ElectLeadersResponse:
            election = _ELECTIONS.get(request.type)
            _check(election is not None, f"type: unknown election type {request.type}")
            assert election is not None
            wanted = [(p.topic, p.partition) for p in request.partitions]
            twice = _repeated(wanted)
            checked: list[tuple[str, int] | ApiError] = []
            for i, (topic, partition) in enumerate(wanted):
                try:
                    _topic_partition(f"partitions[{i}]", topic, partition)
                    _check(
                        (topic, partition) not in twice,
                        f"partitions[{i}]: {topic}-{partition} is listed more than once",
                    )
                    checked.append((topic, partition))
                except ApiError as exc:
                    checked.append(exc)
            valid = [x for x in checked if not isinstance(x, ApiError)]
            everything = not wanted

            results = await self._s.write(
                context, lambda c: c.elect_leaders(election, None if everything else valid)
            )
            out = metadata_pb2.ElectLeadersResponse(error=_wire(Errors.NONE))
            if everything:
                for r in results:
                    suffix = f"-{r.partition}"
                    topic = r.name[: -len(suffix)] if r.name.endswith(suffix) else r.name
                    out.results.append(
                        metadata_pb2.PartitionResult(
                            topic=topic,
                            partition=r.partition,
                            error=_wire(r.error),
                            message=r.message,
                        )
                    )
                return out
            done = iter(results)
            for (topic, partition), item in zip(wanted, checked, strict=True):
                r = _outcome(item, done)
                out.results.append(
                    metadata_pb2.PartitionResult(
                        topic=topic, partition=partition, error=_wire(r.error), message=r.message
                    )
                )
            return out

        return await self._s.answer("ElectLeaders", metadata_pb2.ElectLeadersResponse, body)

    async def AlterPartitionReassignments(
        self, request: metadata_pb2.AlterPartitionReassignmentsRequest, context: Any
    ) -> metadata_pb2.AlterPartitionReassignmentsResponse:
        await self._s.authorize(context, "AlterPartitionReassignments", "ALTER")

        async def body() -> metadata_pb2.AlterPartitionReassignmentsResponse:
            twice = _repeated([(p.topic, p.partition) for p in request.partitions])
            checked: list[tuple[str, int, tuple[int, ...] | None] | ApiError] = []
            for i, p in enumerate(request.partitions):
                at = f"partitions[{i}]"
                try:
                    _topic_partition(at, p.topic, p.partition)
                    _check(
                        (p.topic, p.partition) not in twice,
                        f"{at}: {p.topic}-{p.partition} is listed more than once",
                    )
                    target = _replicas(f"{at}.replicas", p.replicas) if p.replicas else None
                    checked.append((p.topic, p.partition, target))
                except ApiError as exc:
                    checked.append(exc)
            valid = [x for x in checked if not isinstance(x, ApiError)]
            answers = await self._s.write(context, lambda c: c.alter_reassignments(valid))
            results = iter(answers)
            out = metadata_pb2.AlterPartitionReassignmentsResponse(error=_wire(Errors.NONE))
            for p, item in zip(request.partitions, checked, strict=True):
                r = _outcome(item, results)
                out.results.append(
                    metadata_pb2.PartitionResult(
                        topic=p.topic,
                        partition=p.partition,
                        error=_wire(r.error),
                        message=r.message,
                    )
                )
            return out

        return await self._s.answer(
            "AlterPartitionReassignments",
            metadata_pb2.AlterPartitionReassignmentsResponse,
            body,
        )

    async def ListPartitionReassignments(
        self, request: metadata_pb2.ListPartitionReassignmentsRequest, context: Any
    ) -> metadata_pb2.ListPartitionReassignmentsResponse:
        await self._s.authorize(context, "ListPartitionReassignments", "DESCRIBE")

        async def body() -> metadata_pb2.ListPartitionReassignmentsResponse:
            wanted = {
                _topic_partition(f"partitions[{i}]", p.topic, p.partition)
                for i, p in enumerate(request.partitions)
            }
            image = await self._s.read(context, request.linearizable)
            return metadata_pb2.ListPartitionReassignmentsResponse(
                error=_wire(Errors.NONE),
                reassignments=_ongoing(image, wanted or None),
                metadata_offset=image.offset,
            )

        return await self._s.answer(
            "ListPartitionReassignments",
            metadata_pb2.ListPartitionReassignmentsResponse,
            body,
        )

    # -- features -------------------------------------------------------------------

    async def DescribeFeatures(
        self, request: metadata_pb2.DescribeFeaturesRequest, context: Any
    ) -> metadata_pb2.DescribeFeaturesResponse:
        await self._s.authorize(context, "DescribeFeatures", "DESCRIBE")

        async def body() -> metadata_pb2.DescribeFeaturesResponse:
            image = await self._s.read(context, request.linearizable)
            return metadata_pb2.DescribeFeaturesResponse(
                error=_wire(Errors.NONE),
                features=feature_descriptions(image),
                metadata_offset=image.offset,
            )

        return await self._s.answer("DescribeFeatures", metadata_pb2.DescribeFeaturesResponse, body)

    async def UpdateFeatures(
        self, request: metadata_pb2.UpdateFeaturesRequest, context: Any
    ) -> metadata_pb2.UpdateFeaturesResponse:
        await self._s.authorize(context, "UpdateFeatures", "ALTER")

        async def body() -> metadata_pb2.UpdateFeaturesResponse:
            twice = _repeated([u.name for u in request.updates])
            checked: list[ApiError | None] = []
            for i, u in enumerate(request.updates):
                at = f"updates[{i}]"
                try:
                    _check(bool(u.name), f"{at}.name must not be empty")
                    _check(u.name not in twice, f"{at}: feature {u.name} is listed more than once")
                    _check(u.level >= 0, f"{at}.level {u.level} is negative")
                    checked.append(None)
                except ApiError as exc:
                    checked.append(exc)
            valid = {
                u.name: u.level
                for u, item in zip(request.updates, checked, strict=True)
                if item is None
            }
            validate_only = request.validate_only
            results = await self._s.write(
                context, lambda c: c.update_features(valid, validate_only)
            )
            by_name = {r.name: r for r in results}
            out = metadata_pb2.UpdateFeaturesResponse(error=_wire(Errors.NONE))
            for u, item in zip(request.updates, checked, strict=True):
                r = _item_error(item.code, item.message) if item is not None else by_name[u.name]
                out.results.append(
                    metadata_pb2.FeatureUpdateResult(
                        name=u.name, error=_wire(r.error), message=r.message
                    )
                )
            return out

        return await self._s.answer("UpdateFeatures", metadata_pb2.UpdateFeaturesResponse, body)

    # -- ACLs ----------------------------------------------------------------------

    async def CreateAcls(
        self, request: metadata_pb2.CreateAclsRequest, context: Any
    ) -> metadata_pb2.CreateAclsResponse:
        await self._s.authorize(context, "CreateAcls", "ALTER")

        async def body() -> metadata_pb2.CreateAclsResponse:
            checked: list[StandardAcl | ApiError] = []
            for i, b in enumerate(request.creations):
                try:
                    checked.append(acl_from_proto(f"creations[{i}]", b))
                except ApiError as exc:
                    checked.append(exc)
            valid = [a for a in checked if isinstance(a, StandardAcl)]
            results = await self._s.write(context, lambda c: c.create_acls(valid))
            done = iter(results)
            out = metadata_pb2.CreateAclsResponse(error=_wire(Errors.NONE))
            for item in checked:
                r = _outcome(item, done)
                out.results.append(
                    metadata_pb2.AclCreationResult(error=_wire(r.error), message=r.message)
                )
            return out

        return await self._s.answer("CreateAcls", metadata_pb2.CreateAclsResponse, body)

    async def DeleteAcls(
        self, request: metadata_pb2.DeleteAclsRequest, context: Any
    ) -> metadata_pb2.DeleteAclsResponse:
        await self._s.authorize(context, "DeleteAcls", "ALTER")

        async def body() -> metadata_pb2.DeleteAclsResponse:
            checked: list[AclBindingFilter | ApiError] = []
            for i, f in enumerate(request.filters):
                try:
                    checked.append(acl_filter_from_proto(f"filters[{i}]", f))
                except ApiError as exc:
                    checked.append(exc)
            valid = [f for f in checked if isinstance(f, AclBindingFilter)]
            deleted = await self._s.write(context, lambda c: c.delete_acls(valid))
            results = iter(deleted)
            out = metadata_pb2.DeleteAclsResponse(error=_wire(Errors.NONE))
            for item in checked:
                found = item if isinstance(item, ApiError) else next(results)
                if isinstance(found, ApiError):
                    out.results.append(
                        metadata_pb2.DeleteAclsFilterResult(
                            error=_wire(found.code), message=found.message
                        )
                    )
                else:
                    out.results.append(
                        metadata_pb2.DeleteAclsFilterResult(
                            error=_wire(Errors.NONE),
                            deleted=[stored_acl(i, a) for i, a in found],
                        )
                    )
            return out

        return await self._s.answer("DeleteAcls", metadata_pb2.DeleteAclsResponse, body)

    async def DescribeAcls(
        self, request: metadata_pb2.DescribeAclsRequest, context: Any
    ) -> metadata_pb2.DescribeAclsResponse:
        await self._s.authorize(context, "DescribeAcls", "DESCRIBE")

        async def body() -> metadata_pb2.DescribeAclsResponse:
            f = acl_filter_from_proto("filter", request.filter)
            image = await self._s.read(context, request.linearizable)
            return metadata_pb2.DescribeAclsResponse(
                error=_wire(Errors.NONE),
                acls=[stored_acl(i, a) for i, a in describe_acls(image, f)],
                metadata_offset=image.offset,
            )

        return await self._s.answer("DescribeAcls", metadata_pb2.DescribeAclsResponse, body)


def _acl_enum(kind: type[E], field: str, value: int) -> E:
    try:
        return kind(value)
    except ValueError:
        raise _invalid(f"{field}: unknown {kind.__name__} {value}") from None


def acl_from_proto(at: str, b: metadata_pb2.AclBinding) -> StandardAcl:
    """A binding from the wire; INVALID_REQUEST naming what is wrong."""
    acl = StandardAcl(
        _acl_enum(AclResourceType, f"{at}.resource_type", b.resource_type),
        b.resource_name,
        _acl_enum(PatternType, f"{at}.pattern_type", b.pattern_type),
        b.principal,
        b.host,
        _acl_enum(AclOperation, f"{at}.operation", b.operation),
        _acl_enum(AclPermission, f"{at}.permission", b.permission),
    )
    try:
        acl.check()
    except InvalidAclError as exc:
        raise _invalid(f"{at}: {exc}") from None
    return acl


def acl_filter_from_proto(at: str, f: metadata_pb2.AclBindingFilter) -> AclBindingFilter:
    out = AclBindingFilter(
        _acl_enum(AclResourceType, f"{at}.resource_type", f.resource_type),
        f.resource_name if f.HasField("resource_name") else None,
        _acl_enum(PatternType, f"{at}.pattern_type", f.pattern_type),
        f.principal if f.HasField("principal") else None,
        f.host if f.HasField("host") else None,
        _acl_enum(AclOperation, f"{at}.operation", f.operation),
        _acl_enum(AclPermission, f"{at}.permission", f.permission),
    )
    try:
        out.check()
    except InvalidAclError as exc:
        raise _invalid(f"{at}: {exc}") from None
    return out


def stored_acl(acl_id: str, a: StandardAcl) -> metadata_pb2.StoredAcl:
    return metadata_pb2.StoredAcl(
        id=acl_id,
        binding=metadata_pb2.AclBinding(
            resource_type=cast(metadata_pb2.AclResourceType, int(a.resource_type)),
            resource_name=a.resource_name,
            pattern_type=cast(metadata_pb2.AclPatternType, int(a.pattern_type)),
            principal=a.principal,
            host=a.host,
            operation=cast(metadata_pb2.AclOperation, int(a.operation)),
            permission=cast(metadata_pb2.AclPermissionType, int(a.permission)),
        ),
    )


def _alter_configs_resource(
    i: int, r: metadata_pb2.AlterConfigsResource, twice: set[tuple[int, str]]
) -> tuple[ResourceType, str, list[AlterConfigOp]]:
    at = f"resources[{i}]"
    rtype = _resource_type(f"{at}.type", r.type)
    _check((int(r.type), r.name) not in twice, f"{at}: the resource is listed more than once")
    ops = []
    for j, op in enumerate(r.ops):
        where = f"{at}.ops[{j}]"
        _check(op.op in (metadata_pb2.SET, metadata_pb2.DELETE), f"{where}.op: unknown op {op.op}")
        _check(
            not (op.has_expected and op.expect_absent),
            f"{where}: has_expected and expect_absent are exclusive",
        )
        ops.append(
            AlterConfigOp(
                op.key,
                op.value if op.op == metadata_pb2.SET else None,
                expected=op.expected_value if op.has_expected else None,
                expect_absent=op.expect_absent,
            )
        )
    return rtype, r.name, ops


# -- BrokerLifecycleService --------------------------------------------------------------


class BrokerLifecycleServicer(metadata_pb2_grpc.BrokerLifecycleServiceServicer):
    """kq.metadata.BrokerLifecycleService on one controller node."""

    def __init__(self, controller: QuorumController, server: PluginHost) -> None:
        self._s = _Servicer(controller, server)

    async def _as_broker(self, context: Any, method: str, broker_id: int) -> None:
        """Over TLS, a lifecycle call must come from the certificate of the
        broker it names (docs/security.md): anyone else is refused
        PERMISSION_DENIED, naming who called and what it claimed.  ACLs do
        not apply: a broker's lifecycle is its own."""
        caller = peer_identity(context)
        if caller is None or (caller.role is IdentityRole.BROKER and caller.node_id == broker_id):
            return
        audit_refusal(
            caller,
            peer_host(context),
            method,
            f"broker {broker_id}",
            method,
            "only the broker's own certificate may",
        )
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{caller.principal} ({caller.uri}) may not call {method} as broker {broker_id}",
        )

    async def RegisterBroker(
        self, request: metadata_pb2.RegisterBrokerRequest, context: Any
    ) -> metadata_pb2.RegisterBrokerResponse:
        await self._as_broker(context, "RegisterBroker", request.broker_id)

        async def body() -> metadata_pb2.RegisterBrokerResponse:
            req = _register_request(request)
            epoch = await self._s.write(context, lambda c: c.register_broker(req, self._s.now_ms()))
            return metadata_pb2.RegisterBrokerResponse(error=_wire(Errors.NONE), broker_epoch=epoch)

        return await self._s.answer("RegisterBroker", metadata_pb2.RegisterBrokerResponse, body)

    async def BrokerHeartbeat(
        self, request: metadata_pb2.BrokerHeartbeatRequest, context: Any
    ) -> metadata_pb2.BrokerHeartbeatResponse:
        await self._as_broker(context, "BrokerHeartbeat", request.broker_id)

        async def body() -> metadata_pb2.BrokerHeartbeatResponse:
            _broker_and_epoch(request.broker_id, request.broker_epoch)
            _check(
                request.current_metadata_offset >= -1,
                f"current_metadata_offset {request.current_metadata_offset} is negative",
            )
            # The wire carries an end offset (every record below it
            # applied); the controller, as Kafka, takes the offset of the
            # last record applied.
            req = HeartbeatRequest(
                request.broker_id,
                request.broker_epoch,
                max(-1, request.current_metadata_offset - 1),
                want_fence=request.want_fence,
                want_shutdown=request.want_shutdown,
            )
            r = await self._s.write(context, lambda c: c.heartbeat(req, self._s.now_ms()))
            return metadata_pb2.BrokerHeartbeatResponse(
                error=_wire(Errors.NONE),
                is_caught_up=r.is_caught_up,
                is_fenced=r.is_fenced,
                should_shut_down=r.should_shut_down,
                in_controlled_shutdown=r.in_controlled_shutdown,
            )

        return await self._s.answer("BrokerHeartbeat", metadata_pb2.BrokerHeartbeatResponse, body)

    async def AlterPartition(
        self, request: metadata_pb2.AlterPartitionRequest, context: Any
    ) -> metadata_pb2.AlterPartitionResponse:
        await self._as_broker(context, "AlterPartition", request.broker_id)

        async def body() -> metadata_pb2.AlterPartitionResponse:
            _broker_and_epoch(request.broker_id, request.broker_epoch)
            keys = [(t.topic_id, p.partition) for t in request.topics for p in t.partitions]
            twice = _repeated(keys)
            checked: list[AlterPartitionItem | ApiError] = []
            for i, t in enumerate(request.topics):
                for j, p in enumerate(t.partitions):
                    try:
                        checked.append(_alter_partition_item(i, j, t.topic_id, p, twice))
                    except ApiError as exc:
                        checked.append(exc)
            valid = [x for x in checked if isinstance(x, AlterPartitionItem)]
            broker_id, broker_epoch = request.broker_id, request.broker_epoch

            def decide(
                c: Controller,
            ) -> ControllerResult[
                tuple[list[ItemResult], dict[tuple[str, int], PartitionRegistration]]
            ]:
                made = c.alter_partition(broker_id, broker_epoch, valid)
                current = {}
                for topic_id, partition in keys:
                    p = c.image.partition(topic_id, partition)
                    if p is not None:
                        current[(topic_id, partition)] = p
                return ControllerResult(made.records, (made.response, current), made.atomic)

            results, current = await self._s.write(context, decide)
            done = iter(results)
            items = iter(zip(keys, checked, strict=True))
            out = metadata_pb2.AlterPartitionResponse(error=_wire(Errors.NONE))
            for t in request.topics:
                topic_result = metadata_pb2.AlterPartitionTopicResult(topic_id=t.topic_id)
                for _ in t.partitions:
                    key, item = next(items)
                    r = _outcome(item, done)
                    state = r.partition_state if r.error is Errors.NONE else None
                    if state is None and r.error is not Errors.UNKNOWN_TOPIC_OR_PARTITION:
                        state = current.get(key)
                    topic_result.partitions.append(_alter_partition_result(key[1], r, state))
                out.topics.append(topic_result)
            return out

        return await self._s.answer("AlterPartition", metadata_pb2.AlterPartitionResponse, body)

    async def AllocateProducerIds(
        self, request: metadata_pb2.AllocateProducerIdsRequest, context: Any
    ) -> metadata_pb2.AllocateProducerIdsResponse:
        await self._as_broker(context, "AllocateProducerIds", request.broker_id)

        async def body() -> metadata_pb2.AllocateProducerIdsResponse:
            broker_id, broker_epoch = request.broker_id, request.broker_epoch
            _broker_and_epoch(broker_id, broker_epoch)
            first, count = await self._s.write(
                context, lambda c: c.allocate_producer_ids(broker_id, broker_epoch)
            )
            return metadata_pb2.AllocateProducerIdsResponse(
                error=_wire(Errors.NONE), first_producer_id=first, count=count
            )

        return await self._s.answer(
            "AllocateProducerIds", metadata_pb2.AllocateProducerIdsResponse, body
        )


def _alter_partition_item(
    i: int,
    j: int,
    topic_id: str,
    p: metadata_pb2.AlterPartitionPartition,
    twice: set[tuple[str, int]],
) -> AlterPartitionItem:
    at = f"topics[{i}].partitions[{j}]"
    _check(is_uuid(topic_id), f"topics[{i}].topic_id {topic_id!r} is not a topic id")
    _check(p.partition >= 0, f"{at}.partition {p.partition} is negative")
    _check(
        (topic_id, p.partition) not in twice,
        f"{at}: partition {p.partition} of topic id {topic_id} is listed more than once",
    )
    _check(p.leader_epoch >= 0, f"{at}.leader_epoch {p.leader_epoch} is negative")
    _check(p.partition_epoch >= 0, f"{at}.partition_epoch {p.partition_epoch} is negative")
    isr = []
    for k, member in enumerate(p.new_isr):
        _check(member.broker_id >= 0, f"{at}.new_isr[{k}].broker_id {member.broker_id} is negative")
        _check(
            member.broker_epoch >= -1,
            f"{at}.new_isr[{k}].broker_epoch {member.broker_epoch} is neither an epoch nor -1",
        )
        isr.append((member.broker_id, member.broker_epoch))
    return AlterPartitionItem(
        topic_id, p.partition, p.leader_epoch, p.partition_epoch, tuple(isr), p.leader_recovered
    )


def _alter_partition_result(
    partition: int, r: ItemResult, state: PartitionRegistration | None
) -> metadata_pb2.AlterPartitionPartitionResult:
    out = metadata_pb2.AlterPartitionPartitionResult(
        partition=partition, error=_wire(r.error), message=r.message, leader=-1
    )
    if state is not None:
        out.leader = state.leader
        out.leader_epoch = state.leader_epoch
        out.partition_epoch = state.partition_epoch
        out.isr.extend(state.isr)
        out.leader_recovering = state.leader_recovery_state is LeaderRecoveryState.RECOVERING
    return out

"""The metadata records: what the controller writes to the quorum's log.

Every change to the cluster's metadata is one of these records, committed
through the quorum and replayed, in log order, by every controller and
broker (KIP-631).  Type numbers follow Kafka's ``apiKey`` of the record of
the same meaning (``metadata/src/main/resources/common/metadata``).

Encoding: one msgpack array per record, ``[type, version, field, ...]``,
fields in the order of the dataclass.  A record whose type or version this
build does not know is an error (:class:`UnknownRecordError`), never skipped:
a replica that silently skipped a record would hold different metadata from
the others.  A new version of a record must get a new decoder here before
any controller writes it (feature levels gate that, KIP-584).

Records of the quorum's key-value store share the log; they are msgpack
arrays whose first element is a string, so :func:`is_metadata_record` tells
the two apart from the first two bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

from metadata.acls import (
    AclOperation,
    AclPermission,
    AclResourceType,
    PatternType,
    StandardAcl,
)

__all__ = [
    "NO_LEADER",
    "NO_LEADER_CHANGE",
    "AccessControlEntryRecord",
    "BrokerRegistrationChangeRecord",
    "ConfigRecord",
    "Endpoint",
    "FeatureLevelRecord",
    "FeatureRange",
    "FenceBrokerRecord",
    "LeaderRecoveryState",
    "MalformedRecordError",
    "NoOpRecord",
    "PartitionChangeRecord",
    "PartitionRecord",
    "ProducerIdsRecord",
    "Record",
    "RecordType",
    "RegisterBrokerRecord",
    "RemoveAccessControlEntryRecord",
    "RemoveTopicRecord",
    "TopicRecord",
    "UnfenceBrokerRecord",
    "UnknownRecordError",
    "UnregisterBrokerRecord",
    "decode_record",
    "encode_record",
    "is_metadata_record",
    "record_version",
]

# Partition leader values (Kafka's LeaderConstants).
NO_LEADER = -1
# In a PartitionChangeRecord: the leader stays as it is.
NO_LEADER_CHANGE = -2


class RecordType(enum.IntEnum):
    REGISTER_BROKER = 0
    UNREGISTER_BROKER = 1
    TOPIC = 2
    PARTITION = 3
    CONFIG = 4
    PARTITION_CHANGE = 5
    FENCE_BROKER = 7
    UNFENCE_BROKER = 8
    REMOVE_TOPIC = 9
    FEATURE_LEVEL = 12
    PRODUCER_IDS = 15
    BROKER_REGISTRATION_CHANGE = 17
    ACCESS_CONTROL_ENTRY = 18
    REMOVE_ACCESS_CONTROL_ENTRY = 19
    NO_OP = 20


class LeaderRecoveryState(enum.IntEnum):
    """KIP-704: a leader chosen by an unclean election is RECOVERING until
    it tells the controller (AlterPartition) that its log is consistent."""

    RECOVERED = 0
    RECOVERING = 1


class UnknownRecordError(ValueError):
    """A record of a type or version this build cannot read."""


class MalformedRecordError(ValueError):
    """A record that does not decode as its type and version say."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class FeatureRange:
    """A feature a broker supports, from ``min_level`` to ``max_level``."""

    name: str
    min_level: int
    max_level: int


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    """A broker (re)registers; it starts fenced.  Its broker epoch is the
    offset of this very record (KIP-631): the active controller knows the
    offset its next record will get, and writes it here so that a snapshot
    can carry the epoch too."""

    broker_id: int
    broker_epoch: int
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    features: tuple[FeatureRange, ...] = ()
    fenced: bool = True
    in_controlled_shutdown: bool = False
    # The broker's log directories by id (KIP-858: each directory's
    # directory.id), sorted; written from version 1, empty at version 0.
    log_dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class FenceBrokerRecord:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBrokerRecord:
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord:
    """Changes a registration's flags; None leaves a flag as it is."""

    broker_id: int
    broker_epoch: int
    fenced: bool | None = None
    in_controlled_shutdown: bool | None = None


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """A whole partition: written when a partition is created (and in
    snapshots)."""

    topic_id: str
    partition_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader: int = NO_LEADER
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    leader_epoch: int = 0
    partition_epoch: int = 0
    # KIP-966: replicas out of the ISR that still hold every committed
    # record (they left while the ISR was below min ISR, which freezes the
    # high watermark), and those dropped from that set (unclean shutdown).
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionChangeRecord:
    """Only the changed fields (None: unchanged).  Replay bumps the
    partition epoch always, and the leader epoch whenever ``leader`` is not
    NO_LEADER_CHANGE (Kafka's PartitionRegistration.merge)."""

    topic_id: str
    partition_id: int
    leader: int = NO_LEADER_CHANGE
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    leader_recovery_state: LeaderRecoveryState | None = None
    # KIP-966 (None: unchanged).
    elr: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    topic_id: str


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """Sets ``name`` on a resource; ``value`` None deletes the override.
    ``resource_type`` is a :class:`metadata.configs.ResourceType` number."""

    resource_type: int
    resource_name: str
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord:
    """The next producer id not yet handed out (KIP-730): a block
    [previous next, this next) went to ``broker_id``."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True, slots=True)
class FeatureLevelRecord:
    """Finalizes a feature's level; level 0 removes the feature."""

    name: str
    level: int


@dataclass(frozen=True, slots=True)
class AccessControlEntryRecord:
    """An ACL binding, under an id of its own (KIP-801): DeleteAcls removes
    it by that id.  The enums are Kafka's numbers (:mod:`metadata.acls`)."""

    id: str
    resource_type: AclResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission

    @property
    def acl(self) -> StandardAcl:
        return StandardAcl(
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission,
        )

    @classmethod
    def of(cls, acl_id: str, acl: StandardAcl) -> AccessControlEntryRecord:
        return cls(
            acl_id,
            acl.resource_type,
            acl.resource_name,
            acl.pattern_type,
            acl.principal,
            acl.host,
            acl.operation,
            acl.permission,
        )


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntryRecord:
    """Removes the ACL binding of that id (KIP-801)."""

    id: str


@dataclass(frozen=True, slots=True)
class NoOpRecord:
    """Written when the log is idle (KIP-835) so that followers see time
    pass, and by a new active controller to open its term."""


Record = (
    RegisterBrokerRecord
    | UnregisterBrokerRecord
    | FenceBrokerRecord
    | UnfenceBrokerRecord
    | BrokerRegistrationChangeRecord
    | TopicRecord
    | PartitionRecord
    | PartitionChangeRecord
    | RemoveTopicRecord
    | ConfigRecord
    | ProducerIdsRecord
    | FeatureLevelRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | NoOpRecord
)


# -- encoding ---------------------------------------------------------------


def _ints(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else list(values)


def _enc_register(r: RegisterBrokerRecord) -> list[Any]:
    return [
        r.broker_id,
        r.broker_epoch,
        r.incarnation_id,
        [[e.name, e.host, e.port, e.security_protocol] for e in r.endpoints],
        r.rack,
        [[f.name, f.min_level, f.max_level] for f in r.features],
        r.fenced,
        r.in_controlled_shutdown,
        *([list(r.log_dirs)] if r.log_dirs else []),
    ]


def _enc_partition(r: PartitionRecord) -> list[Any]:
    return [
        r.topic_id,
        r.partition_id,
        list(r.replicas),
        list(r.isr),
        list(r.removing_replicas),
        list(r.adding_replicas),
        r.leader,
        int(r.leader_recovery_state),
        r.leader_epoch,
        r.partition_epoch,
        *([list(r.elr), list(r.last_known_elr)] if _partition_version(r) else []),
    ]


def _enc_change(r: PartitionChangeRecord) -> list[Any]:
    return [
        r.topic_id,
        r.partition_id,
        r.leader,
        _ints(r.isr),
        _ints(r.replicas),
        _ints(r.removing_replicas),
        _ints(r.adding_replicas),
        None if r.leader_recovery_state is None else int(r.leader_recovery_state),
        *([_ints(r.elr), _ints(r.last_known_elr)] if _change_version(r) else []),
    ]


def _partition_version(r: PartitionRecord) -> int:
    # Version 1 adds the KIP-966 fields.  A partition that never had an ELR
    # is written at version 0, as before, so that a log of a cluster that
    # never went below min ISR stays readable by a build without them (Kafka
    # picks the record version from the metadata version for the same end).
    return 1 if r.elr or r.last_known_elr else 0


def _change_version(r: PartitionChangeRecord) -> int:
    return 1 if r.elr is not None or r.last_known_elr is not None else 0


_ENCODERS: dict[type[Any], tuple[RecordType, Callable[[Any], list[Any]]]] = {
    RegisterBrokerRecord: (RecordType.REGISTER_BROKER, _enc_register),
    UnregisterBrokerRecord: (
        RecordType.UNREGISTER_BROKER,
        lambda r: [r.broker_id, r.broker_epoch],
    ),
    FenceBrokerRecord: (RecordType.FENCE_BROKER, lambda r: [r.broker_id, r.broker_epoch]),
    UnfenceBrokerRecord: (RecordType.UNFENCE_BROKER, lambda r: [r.broker_id, r.broker_epoch]),
    BrokerRegistrationChangeRecord: (
        RecordType.BROKER_REGISTRATION_CHANGE,
        lambda r: [r.broker_id, r.broker_epoch, r.fenced, r.in_controlled_shutdown],
    ),
    TopicRecord: (RecordType.TOPIC, lambda r: [r.name, r.topic_id]),
    PartitionRecord: (RecordType.PARTITION, _enc_partition),
    PartitionChangeRecord: (RecordType.PARTITION_CHANGE, _enc_change),
    RemoveTopicRecord: (RecordType.REMOVE_TOPIC, lambda r: [r.topic_id]),
    ConfigRecord: (
        RecordType.CONFIG,
        lambda r: [r.resource_type, r.resource_name, r.name, r.value],
    ),
    ProducerIdsRecord: (
        RecordType.PRODUCER_IDS,
        lambda r: [r.broker_id, r.broker_epoch, r.next_producer_id],
    ),
    FeatureLevelRecord: (RecordType.FEATURE_LEVEL, lambda r: [r.name, r.level]),
    AccessControlEntryRecord: (
        RecordType.ACCESS_CONTROL_ENTRY,
        lambda r: [
            r.id,
            int(r.resource_type),
            r.resource_name,
            int(r.pattern_type),
            r.principal,
            r.host,
            int(r.operation),
            int(r.permission),
        ],
    ),
    RemoveAccessControlEntryRecord: (RecordType.REMOVE_ACCESS_CONTROL_ENTRY, lambda r: [r.id]),
    NoOpRecord: (RecordType.NO_OP, lambda r: []),
}

# The version records are written at by this build, but for the partition
# records, written at version 1 when they carry an ELR (_partition_version).
CURRENT_VERSION = 0


def record_version(record: Record) -> int:
    """The version ``record`` is written at."""
    if isinstance(record, PartitionRecord):
        return _partition_version(record)
    if isinstance(record, PartitionChangeRecord):
        return _change_version(record)
    if isinstance(record, RegisterBrokerRecord):
        # Version 1 carries the log directories (KIP-858); a registration
        # without them is written at version 0, as before.
        return 1 if record.log_dirs else 0
    return CURRENT_VERSION


def encode_record(record: Record) -> bytes:
    rtype, encode = _ENCODERS[type(record)]
    return bytes(msgpack.packb([int(rtype), record_version(record), *encode(record)]))


# -- decoding ---------------------------------------------------------------


def _int(v: Any, what: str) -> int:
    if type(v) is not int:
        raise MalformedRecordError(f"{what} must be an integer, not {v!r}")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise MalformedRecordError(f"{what} must be a string, not {v!r}")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    return None if v is None else _str(v, what)


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise MalformedRecordError(f"{what} must be a boolean, not {v!r}")
    return v


def _opt_bool(v: Any, what: str) -> bool | None:
    return None if v is None else _bool(v, what)


def _int_tuple(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, list) or any(type(x) is not int for x in v):
        raise MalformedRecordError(f"{what} must be a list of integers, not {v!r}")
    return tuple(v)


def _str_tuple(v: Any, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or any(type(x) is not str for x in v):
        raise MalformedRecordError(f"{what} must be a list of strings, not {v!r}")
    return tuple(v)


def _opt_int_tuple(v: Any, what: str) -> tuple[int, ...] | None:
    return None if v is None else _int_tuple(v, what)


def _recovery(v: Any) -> LeaderRecoveryState:
    try:
        return LeaderRecoveryState(_int(v, "leader_recovery_state"))
    except ValueError as exc:
        raise MalformedRecordError(f"unknown leader recovery state {v!r}") from exc


E = TypeVar("E", bound=enum.IntEnum)


def _enum(kind: type[E], v: Any, what: str) -> E:
    try:
        return kind(_int(v, what))
    except ValueError as exc:
        raise MalformedRecordError(f"unknown {what} {v!r}") from exc


def _dec_acl(f: list[Any]) -> AccessControlEntryRecord:
    return AccessControlEntryRecord(
        _str(f[0], "id"),
        _enum(AclResourceType, f[1], "resource_type"),
        _str(f[2], "resource_name"),
        _enum(PatternType, f[3], "pattern_type"),
        _str(f[4], "principal"),
        _str(f[5], "host"),
        _enum(AclOperation, f[6], "operation"),
        _enum(AclPermission, f[7], "permission"),
    )


def _dec_register(f: list[Any]) -> RegisterBrokerRecord:
    endpoints = []
    if not isinstance(f[3], list) or not isinstance(f[5], list):
        raise MalformedRecordError("endpoints and features must be lists")
    for e in f[3]:
        if not isinstance(e, list) or len(e) != 4:
            raise MalformedRecordError(f"malformed endpoint {e!r}")
        endpoints.append(
            Endpoint(
                _str(e[0], "endpoint name"),
                _str(e[1], "endpoint host"),
                _int(e[2], "endpoint port"),
                _str(e[3], "security protocol"),
            )
        )
    features = []
    for x in f[5]:
        if not isinstance(x, list) or len(x) != 3:
            raise MalformedRecordError(f"malformed feature range {x!r}")
        features.append(FeatureRange(_str(x[0], "feature"), _int(x[1], "min"), _int(x[2], "max")))
    return RegisterBrokerRecord(
        _int(f[0], "broker_id"),
        _int(f[1], "broker_epoch"),
        _str(f[2], "incarnation_id"),
        tuple(endpoints),
        _opt_str(f[4], "rack"),
        tuple(features),
        _bool(f[6], "fenced"),
        _bool(f[7], "in_controlled_shutdown"),
        # Version 0 has no log directories.
        _str_tuple(f[8], "log_dirs") if len(f) > 8 else (),
    )


def _dec_partition(f: list[Any]) -> PartitionRecord:
    return PartitionRecord(
        _str(f[0], "topic_id"),
        _int(f[1], "partition_id"),
        _int_tuple(f[2], "replicas"),
        _int_tuple(f[3], "isr"),
        _int_tuple(f[4], "removing_replicas"),
        _int_tuple(f[5], "adding_replicas"),
        _int(f[6], "leader"),
        _recovery(f[7]),
        _int(f[8], "leader_epoch"),
        _int(f[9], "partition_epoch"),
        # Version 0 has no ELR: it replays as an empty one.
        _int_tuple(f[10], "elr") if len(f) > 10 else (),
        _int_tuple(f[11], "last_known_elr") if len(f) > 10 else (),
    )


def _dec_change(f: list[Any]) -> PartitionChangeRecord:
    return PartitionChangeRecord(
        _str(f[0], "topic_id"),
        _int(f[1], "partition_id"),
        _int(f[2], "leader"),
        _opt_int_tuple(f[3], "isr"),
        _opt_int_tuple(f[4], "replicas"),
        _opt_int_tuple(f[5], "removing_replicas"),
        _opt_int_tuple(f[6], "adding_replicas"),
        None if f[7] is None else _recovery(f[7]),
        # Version 0 has no ELR fields: the ELR stays as it is.
        _opt_int_tuple(f[8], "elr") if len(f) > 8 else None,
        _opt_int_tuple(f[9], "last_known_elr") if len(f) > 8 else None,
    )


# (type, version) -> (field count, decoder)
_DECODERS: dict[tuple[int, int], tuple[int, Callable[[list[Any]], Record]]] = {
    (RecordType.REGISTER_BROKER, 0): (8, _dec_register),
    (RecordType.REGISTER_BROKER, 1): (9, _dec_register),
    (RecordType.UNREGISTER_BROKER, 0): (
        2,
        lambda f: UnregisterBrokerRecord(_int(f[0], "broker_id"), _int(f[1], "broker_epoch")),
    ),
    (RecordType.FENCE_BROKER, 0): (
        2,
        lambda f: FenceBrokerRecord(_int(f[0], "broker_id"), _int(f[1], "broker_epoch")),
    ),
    (RecordType.UNFENCE_BROKER, 0): (
        2,
        lambda f: UnfenceBrokerRecord(_int(f[0], "broker_id"), _int(f[1], "broker_epoch")),
    ),
    (RecordType.BROKER_REGISTRATION_CHANGE, 0): (
        4,
        lambda f: BrokerRegistrationChangeRecord(
            _int(f[0], "broker_id"),
            _int(f[1], "broker_epoch"),
            _opt_bool(f[2], "fenced"),
            _opt_bool(f[3], "in_controlled_shutdown"),
        ),
    ),
    (RecordType.TOPIC, 0): (
        2,
        lambda f: TopicRecord(_str(f[0], "name"), _str(f[1], "topic_id")),
    ),
    (RecordType.PARTITION, 0): (10, _dec_partition),
    (RecordType.PARTITION, 1): (12, _dec_partition),
    (RecordType.PARTITION_CHANGE, 0): (8, _dec_change),
    (RecordType.PARTITION_CHANGE, 1): (10, _dec_change),
    (RecordType.REMOVE_TOPIC, 0): (1, lambda f: RemoveTopicRecord(_str(f[0], "topic_id"))),
    (RecordType.CONFIG, 0): (
        4,
        lambda f: ConfigRecord(
            _int(f[0], "resource_type"),
            _str(f[1], "resource_name"),
            _str(f[2], "name"),
            _opt_str(f[3], "value"),
        ),
    ),
    (RecordType.PRODUCER_IDS, 0): (
        3,
        lambda f: ProducerIdsRecord(
            _int(f[0], "broker_id"), _int(f[1], "broker_epoch"), _int(f[2], "next_producer_id")
        ),
    ),
    (RecordType.FEATURE_LEVEL, 0): (
        2,
        lambda f: FeatureLevelRecord(_str(f[0], "name"), _int(f[1], "level")),
    ),
    (RecordType.ACCESS_CONTROL_ENTRY, 0): (8, _dec_acl),
    (RecordType.REMOVE_ACCESS_CONTROL_ENTRY, 0): (
        1,
        lambda f: RemoveAccessControlEntryRecord(_str(f[0], "id")),
    ),
    (RecordType.NO_OP, 0): (0, lambda f: NoOpRecord()),
}


def _versions(rtype: int) -> list[int]:
    return sorted(v for t, v in _DECODERS if t == rtype)


def decode_record(data: bytes) -> Record:
    """Decode one metadata record; raises :class:`UnknownRecordError` for a
    type or version this build does not know, :class:`MalformedRecordError`
    for anything else that is wrong."""
    try:
        obj = msgpack.unpackb(data)
    except (msgpack.UnpackException, ValueError) as exc:
        raise MalformedRecordError(f"a metadata record does not decode: {exc}") from exc
    if not isinstance(obj, list) or len(obj) < 2:
        raise MalformedRecordError(f"a metadata record must be [type, version, ...], not {obj!r}")
    rtype, version, fields = obj[0], obj[1], obj[2:]
    if type(rtype) is not int or type(version) is not int:
        raise MalformedRecordError(f"record type and version must be integers: {obj[:2]!r}")
    entry = _DECODERS.get((rtype, version))
    if entry is None:
        try:
            name = f"{RecordType(rtype).name} ({rtype})"
        except ValueError:
            raise UnknownRecordError(
                f"unknown metadata record type {rtype} (version {version}): written by a newer kq?"
            ) from None
        known = ", ".join(map(str, _versions(rtype)))
        raise UnknownRecordError(
            f"metadata record {name} has version {version}; this build reads versions {known}"
        )
    count, decode = entry
    name = RecordType(rtype).name
    if len(fields) != count:
        raise MalformedRecordError(
            f"metadata record {name} v{version} has {len(fields)} fields, expected {count}"
        )
    try:
        return decode(fields)
    except (TypeError, IndexError) as exc:
        raise MalformedRecordError(f"malformed metadata record {name} v{version}: {exc}") from exc


def is_metadata_record(data: bytes) -> bool:
    """True for a metadata record, False for a key-value store record (an
    array whose first element is a string), from the first two bytes."""
    if len(data) < 2 or not 0x90 <= data[0] <= 0x9F:
        return False
    return data[1] <= 0x7F  # positive fixint: every record type is < 128

"""Access control lists: what an ACL binding is, and the filters that find
bindings (Kafka's ``AclBinding``, ``AclBindingFilter`` and the
``StandardAcl`` of KIP-801).

An ACL allows or denies one principal, from one host, one operation on the
resources that match a pattern: a topic, group, transactional id or the
cluster, named literally (``*`` for every resource of the type) or by a
prefix.  The numbers of the enums are Kafka's (``org.apache.kafka.common.acl``
and ``org.apache.kafka.common.resource``), so that they mean the same on the
wire and in the log.  Pure: no I/O.  The decision itself is
:mod:`metadata.authorizer`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBindingFilter",
    "AclOperation",
    "AclPermission",
    "AclResourceType",
    "InvalidAclError",
    "PatternType",
    "StandardAcl",
    "check_principal",
]

# The one cluster resource's name (Kafka's Resource.CLUSTER_NAME).
CLUSTER_NAME = "kafka-cluster"
# A literal resource name that matches every resource of its type, and a
# host that matches every host (Kafka's ResourcePattern.WILDCARD_RESOURCE).
WILDCARD = "*"
# The principal that matches every principal (Kafka's
# Acl.WILDCARD_PRINCIPAL_STRING; StandardAuthorizerData matches it for any
# principal, whatever its type).
WILDCARD_PRINCIPAL = "User:*"

_PRINCIPAL_TYPES = ("User", "Controller", "Broker")


class InvalidAclError(ValueError):
    """An ACL binding or filter that cannot be stored or used."""


class AclResourceType(enum.IntEnum):
    """Kafka's ResourceType (the ones kq has resources of)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    """Kafka's PatternType: LITERAL and PREFIXED are patterns; ANY and MATCH
    only filters."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """Kafka's AclOperation (less the delegation token ones)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(enum.IntEnum):
    """Kafka's AclPermissionType."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def check_principal(principal: str, what: str = "principal") -> None:
    """A principal is ``Type:name`` (``User:alice``, ``Broker:3``,
    ``User:*``); anything else is refused, naming it."""
    kind, colon, name = principal.partition(":")
    if not colon or not name or kind not in _PRINCIPAL_TYPES:
        raise InvalidAclError(
            f"{what} {principal!r} is not Type:name with Type one of {', '.join(_PRINCIPAL_TYPES)}"
            " (e.g. User:alice, User:*)"
        )


@dataclass(frozen=True, slots=True)
class StandardAcl:
    """One ACL binding as the authorizer keeps it (Kafka's StandardAcl)."""

    resource_type: AclResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission

    def check(self) -> None:
        """Refuse a binding that is not concrete (Kafka's
        AclControlManager.validateNewAcl): every field must name one thing."""
        if self.resource_type in (AclResourceType.UNKNOWN, AclResourceType.ANY):
            raise InvalidAclError(f"resource type {self.resource_type.name} is not a resource")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(
                f"pattern type {self.pattern_type.name} is a filter, not a pattern"
                " (LITERAL or PREFIXED)"
            )
        if not self.resource_name:
            raise InvalidAclError("the resource name must not be empty")
        if self.resource_type is AclResourceType.CLUSTER and (
            self.pattern_type is not PatternType.LITERAL
            or self.resource_name not in (CLUSTER_NAME, WILDCARD)
        ):
            raise InvalidAclError(
                f"the cluster resource is the literal {CLUSTER_NAME!r}, not "
                f"{self.pattern_type.name.lower()} {self.resource_name!r}"
            )
        if self.pattern_type is PatternType.PREFIXED and self.resource_name == WILDCARD:
            raise InvalidAclError("a prefixed pattern of '*' means nothing; use literal '*'")
        check_principal(self.principal)
        if not self.host:
            raise InvalidAclError("the host must not be empty ('*' is every host)")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"operation {self.operation.name} is not an operation")
        if self.permission not in (AclPermission.ALLOW, AclPermission.DENY):
            raise InvalidAclError(f"permission {self.permission.name} is not ALLOW or DENY")

    @property
    def resource(self) -> str:
        """As people read it: ``TOPIC orders`` or ``TOPIC orders- (prefixed)``."""
        prefixed = " (prefixed)" if self.pattern_type is PatternType.PREFIXED else ""
        return f"{self.resource_type.name} {self.resource_name}{prefixed}"

    def __str__(self) -> str:
        return (
            f"{self.principal} {self.permission.name} {self.operation.name} "
            f"from {self.host} on {self.resource}"
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings a DescribeAcls or DeleteAcls names (Kafka's
    AclBindingFilter: a ResourcePatternFilter and an
    AccessControlEntryFilter).  None and the ANY values match anything."""

    resource_type: AclResourceType = AclResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermission = AclPermission.ANY

    def check(self) -> None:
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission):
            if int(value) == 0:
                raise InvalidAclError(f"a filter cannot match {type(value).__name__} UNKNOWN")
        if self.principal is not None:
            check_principal(self.principal, "the principal filter")

    def matches_pattern(self, acl: StandardAcl) -> bool:
        """Kafka's ResourcePatternFilter.matches: MATCH with a name finds
        the literal pattern of that name, the literal ``*`` and every prefix
        of the name; ANY (or a pattern type) with a name finds that exact
        name."""
        if (
            self.resource_type is not AclResourceType.ANY
            and acl.resource_type != self.resource_type
        ):
            return False
        if (
            self.pattern_type not in (PatternType.ANY, PatternType.MATCH)
            and acl.pattern_type != self.pattern_type
        ):
            return False
        name = self.resource_name
        if name is None:
            return True
        if self.pattern_type is not PatternType.MATCH:
            return acl.resource_name == name
        if acl.pattern_type is PatternType.LITERAL:
            return acl.resource_name in (name, WILDCARD)
        return name.startswith(acl.resource_name)

    def matches_entry(self, acl: StandardAcl) -> bool:
        """Kafka's AccessControlEntryFilter.matches."""
        return (
            (self.principal is None or acl.principal == self.principal)
            and (self.host is None or acl.host == self.host)
            and (self.operation is AclOperation.ANY or acl.operation == self.operation)
            and (self.permission is AclPermission.ANY or acl.permission == self.permission)
        )

    def matches(self, acl: StandardAcl) -> bool:
        return self.matches_pattern(acl) and self.matches_entry(acl)

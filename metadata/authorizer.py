"""Authorization decisions: may this principal, from this host, do this
operation on this resource?  Kafka's ``StandardAuthorizer`` (KIP-801), pure:
it reads the ACL bindings of a :class:`~metadata.image.MetadataImage` and
decides, with no I/O; the servers call it with the caller's identity from
its certificate and log what it refuses.

The rules, in the order they apply (``StandardAuthorizerData.authorize``):

1. a super user (``authorizer.super_users``) may do anything;
2. the bindings that apply are those whose pattern matches the resource
   (its literal name, the literal ``*``, or a prefix of its name), whose
   principal is the caller's or ``User:*``, and whose host is the caller's
   or ``*``;
3. a DENY of the operation (or of ALL) wins over any ALLOW;
4. an ALLOW of the operation allows it, as does an ALLOW of ALL, and an
   ALLOW of READ, WRITE, DELETE or ALTER allows DESCRIBE, an ALLOW of
   ALTER_CONFIGS allows DESCRIBE_CONFIGS (implied operations);
5. otherwise it is denied, except that a resource with no binding at all
   (for anyone) is allowed when ``allow_everyone_if_no_acl_found`` is set.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from metadata.acls import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclOperation,
    AclPermission,
    AclResourceType,
    StandardAcl,
    check_principal,
)
from metadata.image import AclImage

__all__ = [
    "Action",
    "AuthorizerSettings",
    "Decision",
    "Verdict",
    "authorize",
    "cluster",
]

# Kafka's AclEntry: the allows that imply DESCRIBE and DESCRIBE_CONFIGS.
_IMPLY_DESCRIBE = frozenset(
    {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
)
_IMPLY_DESCRIBE_CONFIGS = frozenset({AclOperation.ALTER_CONFIGS})


class Decision(enum.Enum):
    ALLOWED = "ALLOWED"
    DENIED = "DENIED"


@dataclass(frozen=True, slots=True)
class AuthorizerSettings:
    """Kafka's ``super.users`` and ``allow.everyone.if.no.acl.found``."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    def __post_init__(self) -> None:
        for principal in self.super_users:
            check_principal(principal, "super user")
            if principal == WILDCARD_PRINCIPAL:
                raise ValueError(
                    "User:* as a super user would let everyone do anything; "
                    "name the super users one by one"
                )


@dataclass(frozen=True, slots=True)
class Action:
    """An operation on one resource."""

    operation: AclOperation
    resource_type: AclResourceType
    resource_name: str

    def __str__(self) -> str:
        return f"{self.operation.name} on {self.resource_type.name} {self.resource_name}"


def cluster(operation: AclOperation) -> Action:
    """``operation`` on the cluster resource."""
    return Action(operation, AclResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    # Why, for the audit log: the rule or the binding that decided.
    reason: str

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOWED


def _allows(acl_op: AclOperation, op: AclOperation) -> bool:
    if acl_op in (AclOperation.ALL, op):
        return True
    if op is AclOperation.DESCRIBE:
        return acl_op in _IMPLY_DESCRIBE
    if op is AclOperation.DESCRIBE_CONFIGS:
        return acl_op in _IMPLY_DESCRIBE_CONFIGS
    return False


def _decide(
    acls: Iterable[StandardAcl], principal: str, host: str, op: AclOperation
) -> tuple[bool, StandardAcl | None, StandardAcl | None]:
    """(any binding on the resource, the first matching DENY, the first
    matching ALLOW)."""
    found = False
    allow: StandardAcl | None = None
    for acl in acls:
        found = True
        if acl.principal not in (principal, WILDCARD_PRINCIPAL):
            continue
        if acl.host not in (host, WILDCARD):
            continue
        if acl.permission is AclPermission.DENY:
            # A DENY is not widened by implication: DENY READ does not deny
            # DESCRIBE (Kafka's StandardAuthorizerData.findResult).
            if acl.operation in (AclOperation.ALL, op):
                return True, acl, allow
        elif allow is None and _allows(acl.operation, op):
            allow = acl
    return found, None, allow


def authorize(
    acls: AclImage, settings: AuthorizerSettings, principal: str, host: str, action: Action
) -> Verdict:
    """May ``principal`` calling from ``host`` do ``action``?"""
    if principal in settings.super_users:
        return Verdict(Decision.ALLOWED, "super user")
    found, deny, allow = _decide(
        acls.on_resource(action.resource_type, action.resource_name),
        principal,
        host,
        action.operation,
    )
    if deny is not None:
        return Verdict(Decision.DENIED, f"denied by ACL: {deny}")
    if allow is not None:
        return Verdict(Decision.ALLOWED, f"allowed by ACL: {allow}")
    if not found and settings.allow_everyone_if_no_acl_found:
        return Verdict(Decision.ALLOWED, "no ACL on the resource (allow_everyone_if_no_acl_found)")
    if not found:
        return Verdict(Decision.DENIED, "no ACL on the resource")
    return Verdict(Decision.DENIED, "no ACL allows it")

"""Who calls a broker's services and what they may do: the caller's
identity from its verified certificate (never from a message), and the
ACL decision over the metadata image's bindings.  Shared by the data
plane's service and the group coordinator's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from metadata.acls import AclOperation, AclResourceType
from metadata.authorizer import Action, AuthorizerSettings, authorize
from metadata.image import MetadataImage
from quorum.driver.plugin import Identity, audit_refusal, peer_host, peer_identity

__all__ = ["Caller", "Endpoint", "Permissions", "broker_endpoint", "caller_of", "may"]


@dataclass(frozen=True, slots=True)
class Caller:
    """A call's principal (None on a plaintext server) and address."""

    identity: Identity | None
    host: str

    def describe(self) -> str:
        return "an unauthenticated caller" if self.identity is None else self.identity.principal


async def caller_of(context: Any) -> Caller:
    """The caller of a gRPC call; a certificate the CA signed that names no
    kq identity is refused (UNAUTHENTICATED)."""
    try:
        identity = peer_identity(context)
    except ValueError as error:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"bad client certificate: {error}")
        raise AssertionError("unreachable") from None
    return Caller(identity, peer_host(context))


def may(
    image: MetadataImage,
    settings: AuthorizerSettings,
    caller: Caller,
    operation: AclOperation,
    resource_type: AclResourceType,
    name: str,
    method: str,
) -> bool:
    """Whether ``caller`` may do ``operation`` on the resource; a refusal
    is audited."""
    if caller.identity is None:
        return True
    verdict = authorize(
        image.acls,
        settings,
        caller.identity.principal,
        caller.host,
        Action(operation, resource_type, name),
    )
    if not verdict.allowed:
        audit_refusal(
            caller.identity,
            caller.host,
            operation.name,
            f"{resource_type.name} {name}",
            method,
            verdict.reason,
        )
    return verdict.allowed


class Permissions:
    """A service's ACL decisions over the image it serves from: whether a
    caller may, and the refusal a response carries when not (the group and
    transaction services share them)."""

    def __init__(self, image: Callable[[], MetadataImage], settings: AuthorizerSettings) -> None:
        self._image = image
        self.settings = settings

    def may(
        self,
        caller: Caller,
        operation: AclOperation,
        resource: AclResourceType,
        name: str,
        method: str,
    ) -> bool:
        return may(self._image(), self.settings, caller, operation, resource, name, method)

    def refused(
        self,
        response: Any,
        caller: Caller,
        operation: AclOperation,
        resource: AclResourceType,
        name: str,
        method: str,
        code: int,
        what: str,
    ) -> bool:
        """Whether the ACLs refuse ``operation`` on the resource: if so
        ``response`` carries ``code`` and a message naming the caller, the
        operation and ``what`` (the resource as people name it)."""
        if self.may(caller, operation, resource, name, method):
            return False
        response.error = code
        response.message = f"{caller.describe()} is not allowed {operation.name} on {what}"
        return True


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: int
    host: str
    port: int
    rack: str


def broker_endpoint(image: MetadataImage, listener: str, broker_id: int) -> Endpoint | None:
    """Where clients reach ``broker_id`` on ``listener``, by the image."""
    registration = image.brokers.get(broker_id)
    if registration is None:
        return None
    for endpoint in registration.endpoints:
        if endpoint.name == listener:
            return Endpoint(broker_id, endpoint.host, endpoint.port, registration.rack or "")
    return None

"""Who is calling: identities bound to certificates.

Every kq process has a certificate whose subject alternative name carries
its identity as a URI: ``kq://<cluster-id>/controller/<id>``,
``kq://<cluster-id>/broker/<id>`` or ``kq://<cluster-id>/user/<name>``.  A
server takes the caller's identity from the verified peer certificate of
the TLS connection (gRPC's auth context), never from a field of the
message; :func:`peer_identity` reads it.  Pure parsing lives here; making
certificates is :mod:`server.certs`.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Identity",
    "IdentityError",
    "Role",
    "identity_from_pem",
    "peer_identity",
]

SCHEME = "kq"
_CLUSTER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_USER = re.compile(r"[A-Za-z0-9._@-]{1,128}")


class IdentityError(ValueError):
    """A certificate or URI that names no valid kq identity."""


class Role(enum.Enum):
    CONTROLLER = "controller"
    BROKER = "broker"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Identity:
    """A principal: a controller or broker (by node id) or a user (by name)
    of one cluster."""

    cluster_id: str
    role: Role
    # The node id of a controller or broker; the name of a user.
    name: str

    def __post_init__(self) -> None:
        if not _CLUSTER_ID.fullmatch(self.cluster_id):
            raise IdentityError(f"cluster id {self.cluster_id!r} is not valid in an identity")
        if self.role is Role.USER:
            if not _USER.fullmatch(self.name):
                raise IdentityError(f"user name {self.name!r} is not valid in an identity")
        elif not self.name.isdigit() or int(self.name) > 2**31 - 1:
            raise IdentityError(
                f"a {self.role.value}'s identity needs a node id, not {self.name!r}"
            )

    @classmethod
    def node(cls, cluster_id: str, role: Role, node_id: int) -> Identity:
        return cls(cluster_id, role, str(node_id))

    @classmethod
    def user(cls, cluster_id: str, name: str) -> Identity:
        return cls(cluster_id, Role.USER, name)

    @property
    def node_id(self) -> int | None:
        """The node id of a controller or broker; None for a user."""
        return None if self.role is Role.USER else int(self.name)

    @property
    def uri(self) -> str:
        return f"{SCHEME}://{self.cluster_id}/{self.role.value}/{self.name}"

    @property
    def principal(self) -> str:
        """As Kafka names principals: ``User:<name>``, or the node's role
        and id (``Controller:1``, ``Broker:3``)."""
        return f"{self.role.value.capitalize()}:{self.name}"

    @classmethod
    def parse(cls, uri: str) -> Identity:
        prefix = f"{SCHEME}://"
        if not uri.startswith(prefix):
            raise IdentityError(f"{uri!r} is not a {prefix} identity")
        parts = uri[len(prefix) :].split("/")
        if len(parts) != 3:
            raise IdentityError(f"{uri!r} is not {prefix}<cluster-id>/<role>/<id or name>")
        cluster_id, role, name = parts
        try:
            kind = Role(role)
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise IdentityError(f"{uri!r} names role {role!r}; known: {known}") from None
        return cls(cluster_id, kind, name)

    def __str__(self) -> str:
        return self.uri


@functools.lru_cache(maxsize=1024)
def identity_from_pem(pem: bytes) -> Identity:
    """The kq identity of a PEM certificate: its one ``kq://`` URI SAN.

    Cached by the certificate's bytes: every Raft RPC over TLS asks for its
    caller's identity, and a peer presents the same certificate each time."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise IdentityError(f"not a PEM certificate: {exc}") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError("the certificate has no subject alternative name") from None
    uris = [
        u
        for u in san.get_values_for_type(x509.UniformResourceIdentifier)
        if u.startswith(f"{SCHEME}://")
    ]
    if len(uris) != 1:
        raise IdentityError(f"the certificate names {len(uris)} kq identities, not one")
    return Identity.parse(uris[0])


def peer_identity(context: Any) -> Identity | None:
    """The identity of a gRPC call's peer, from the certificate it presented
    and the server verified; None on a plaintext connection (or a peer with
    no certificate)."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") if auth else None
    if not pems:
        return None
    return identity_from_pem(pems[0])

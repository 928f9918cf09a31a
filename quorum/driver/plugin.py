"""The seam between a node's gRPC server and the plug-ins that add services
to it (the metadata controller; later the broker's side).

A plug-in sees the node only as a :class:`PluginHost`: its ids, the quorum
as a :class:`~quorum.driver.raft_client.RaftClient`, the metrics registry and
where the leader is; :class:`quorum.driver.server.NodeServer` implements it.
A plug-in is a :class:`ServerPlugin`: made once the node exists, its
services added to the server, started after the server and the node and
stopped before them.

Authorization is a seam too: the node's services (the quorum's admin
service, the key-value store) and the plug-ins' ask the host's
:class:`Authorizer` whether a caller may do an operation on a resource, with
:func:`authorize_call`.  The quorum knows no ACLs: the metadata plug-in
installs its authorizer (backed by the ACL bindings of its metadata image)
with :meth:`PluginHost.install_authorizer`.  Callers are known only on a TLS
node, from their certificates (:mod:`quorum.driver.identity`); a plaintext
node has no identities and authorizes nothing.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from prometheus_client import CollectorRegistry

from kqproto import quorum_pb2
from quorum.driver.identity import Identity, peer_identity
from quorum.driver.identity import Role as IdentityRole
from quorum.driver.raft_client import RaftClient
from quorum.types import NodeId

__all__ = [
    "AUDIT_LOGGER",
    "CLUSTER_RESOURCE",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_WRITE_TIMEOUT_S",
    "Authorizer",
    "CertifiedCallers",
    "Identity",
    "IdentityRole",
    "Permission",
    "PluginHost",
    "ServerPlugin",
    "audit_refusal",
    "authorize_call",
    "call_timeout",
    "caller_may",
    "peer_host",
    "peer_identity",
]

# The one cluster resource's name (Kafka's Resource.CLUSTER_NAME).
CLUSTER_RESOURCE = "kafka-cluster"
# One INFO line per refused call (docs/security.md).
AUDIT_LOGGER = "kq.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)


@dataclass(frozen=True, slots=True)
class Permission:
    """An authorizer's answer, and why (for the audit log)."""

    allowed: bool
    reason: str


class Authorizer(Protocol):
    """May ``principal`` (``User:alice``, ``Broker:3``), calling from
    ``host`` (an IP address), do ``operation`` (Kafka's AclOperation name:
    ``ALTER``, ``DESCRIBE``, ...) on the resource (Kafka's ResourceType name
    ``CLUSTER``, ``TOPIC``, ... and its name)?"""

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, resource_name: str
    ) -> Permission: ...


class CertifiedCallers:
    """The authorizer of a node with no ACLs to read (one that runs no
    metadata controller: the quorum's own tests and benchmarks): every
    caller the TLS handshake let in may call."""

    def authorize(
        self, principal: str, host: str, operation: str, resource_type: str, resource_name: str
    ) -> Permission:
        return Permission(True, "no authorizer installed on this node: certified callers")


DEFAULT_WRITE_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 2.0


class PluginHost(Protocol):
    """What a node offers the plug-ins on its server."""

    @property
    def node_id(self) -> NodeId: ...

    @property
    def cluster_id(self) -> str: ...

    @property
    def raft(self) -> RaftClient:
        """The quorum, as the state machine above it sees it."""
        ...

    @property
    def registry(self) -> CollectorRegistry:
        """Where the node's Prometheus metrics are registered."""
        ...

    def leader_hint(self) -> quorum_pb2.LeaderHint:
        """The leader as this node knows it, with its client address, for
        answers that redirect a client."""
        ...

    @property
    def authorizer(self) -> Authorizer:
        """Who may call what on this node's services."""
        ...

    def install_authorizer(self, authorizer: Authorizer) -> None:
        """Authorize every service of the node with ``authorizer`` (the
        metadata plug-in's, backed by its ACL bindings)."""
        ...


class ServerPlugin(Protocol):
    """More services on a node's gRPC server."""

    # Full names of the gRPC services it adds (for health and reflection).
    service_names: Sequence[str]

    def add_to_server(self, server: grpc.aio.Server) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def call_timeout(context: Any, default: float) -> float:
    """The time left for a call: its gRPC deadline less a margin to answer,
    or ``default`` when it has none."""
    remaining: float | None = context.time_remaining()
    if remaining is None:
        return default
    return max(0.001, min(default, remaining - 0.01))


def peer_host(context: Any) -> str:
    """The caller's IP address, from gRPC's peer string (``ipv4:1.2.3.4:5``,
    ``ipv6:[::1]:5``); the whole string when it is neither."""
    peer: str = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
        try:
            mapped = ipaddress.IPv6Address(host).ipv4_mapped
        except ValueError:
            return host
        return str(mapped) if mapped is not None else host
    return peer


def _verdict(
    host: PluginHost, context: Any, operation: str, resource_type: str, resource_name: str
) -> tuple[Identity, str, Permission] | None:
    caller = peer_identity(context)
    if caller is None:
        # A plaintext node: no identities, no authorization (docs/security.md).
        return None
    address = peer_host(context)
    permission = host.authorizer.authorize(
        caller.principal, address, operation, resource_type, resource_name
    )
    return caller, address, permission


def caller_may(
    host: PluginHost,
    context: Any,
    operation: str,
    resource_type: str = "CLUSTER",
) -> Callable[[str], bool]:
    """Whether the caller may do ``operation`` on each resource of a type,
    by name, without refusing the call (to leave out of a listing what the
    caller may not see, as Kafka's Metadata).  The caller is read from its
    certificate once, for the whole listing."""
    caller = peer_identity(context)
    if caller is None:
        # A plaintext node: no identities, no authorization (docs/security.md).
        return lambda name: True
    principal, address, authorizer = caller.principal, peer_host(context), host.authorizer

    def may(name: str) -> bool:
        return authorizer.authorize(principal, address, operation, resource_type, name).allowed

    return may


def audit_refusal(
    caller: Identity, address: str, operation: str, resource: str, method: str, reason: str
) -> str:
    """Log one refusal on ``kq.audit``; the message for the caller."""
    audit_log.info(
        "principal=%s host=%s operation=%s resource=%s method=%s decision=DENIED reason=%s",
        caller.principal,
        address,
        operation,
        resource,
        method,
        reason,
    )
    return f"{caller.principal} is not allowed {operation} on {resource}"


async def authorize_call(
    host: PluginHost,
    context: Any,
    method: str,
    operation: str,
    resource_type: str = "CLUSTER",
    resource_name: str = CLUSTER_RESOURCE,
) -> None:
    """Go on if the caller may do ``operation`` on the resource; otherwise
    abort the call PERMISSION_DENIED, naming the principal, the operation
    and the resource, with one line in the audit log."""
    found = _verdict(host, context, operation, resource_type, resource_name)
    if found is None or found[2].allowed:
        return
    caller, address, permission = found
    message = audit_refusal(
        caller, address, operation, f"{resource_type} {resource_name}", method, permission.reason
    )
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

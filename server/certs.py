"""A cluster's certificates: its CA, and a certificate per node and user.

The layout of a certificates folder (``kq certs``)::

    ca.crt                    the cluster's CA (self-signed); every process trusts it
    ca.key                    its key (mode 0600): keep it off the nodes
    controller-<id>.crt/.key  a controller's certificate and key
    broker-<id>.crt/.key      a broker's
    user-<name>.crt/.key      a user's (clients, operators)

Each certificate names its identity as a ``kq://<cluster-id>/<role>/<id>``
URI (:mod:`quorum.driver.identity`) and the hosts it serves as DNS and IP
subject alternative names, so clients can verify the server they reach.
Keys are ECDSA P-256.  The CA's subject holds the cluster id, which every
certificate it issues repeats in its identity.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from quorum.driver.identity import Identity, IdentityError, identity_from_pem
from server.errors import EXIT_USAGE, UserError

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CertError",
    "CertInfo",
    "CertPaths",
    "create_ca",
    "ca_cluster_id",
    "describe_certs",
    "issue",
    "paths_for",
]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
DEFAULT_HOSTS = ("localhost", "127.0.0.1")


class CertError(UserError):
    """A certificates folder or request that cannot be used (says why)."""


@dataclass(frozen=True, slots=True)
class CertPaths:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class CertInfo:
    """One certificate of a folder, as ``kq certs list`` shows it."""

    file: str
    identity: str
    hosts: tuple[str, ...]
    not_after: str
    issuer: str


def paths_for(certs_dir: Path, identity: Identity) -> CertPaths:
    stem = f"{identity.role.value}-{identity.name}"
    return CertPaths(certs_dir / f"{stem}.crt", certs_dir / f"{stem}.key")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def create_ca(
    certs_dir: Path, cluster_id: str, *, days: int = 3650, overwrite: bool = False
) -> CertPaths:
    """A new CA for ``cluster_id`` in ``certs_dir``; refuses to replace an
    existing one unless ``overwrite`` (every certificate it issued would
    stop being trusted)."""
    Identity.user(cluster_id, "ca")  # checks the cluster id
    certs_dir.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(certs_dir / CA_CERT, certs_dir / CA_KEY)
    if paths.cert.exists() and not overwrite:
        raise CertError(
            f"{paths.cert} exists: a new CA would untrust every certificate the old one "
            "issued (overwrite it on purpose, or use another folder)",
            EXIT_USAGE,
        )
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster_id),
            x509.NameAttribute(NameOID.COMMON_NAME, f"kq CA of cluster {cluster_id}"),
        ]
    )
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def _load_ca(certs_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = certs_dir / CA_CERT, certs_dir / CA_KEY
    if not cert_path.exists():
        raise CertError(
            f"no CA in {certs_dir} (no {CA_CERT}): create one with `kq certs create-ca`"
        )
    if not key_path.exists():
        raise CertError(f"{certs_dir} has the CA's certificate but not its key ({CA_KEY})")
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"the CA in {certs_dir} is unreadable: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{key_path} is not an ECDSA key")
    return cert, key


def ca_cluster_id(certs_dir: Path) -> str:
    """The cluster id the CA in ``certs_dir`` was made for."""
    cert = x509.load_pem_x509_certificate((certs_dir / CA_CERT).read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    if not names:
        raise CertError(f"{certs_dir / CA_CERT} names no cluster")
    return str(names[0].value)


def _san_hosts(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not host or any(c.isspace() or c in "/@," for c in host):
                raise CertError(
                    f"host {host!r} is neither an IP address nor a DNS name", EXIT_USAGE
                ) from None
            out.append(x509.DNSName(host))
    return out


def issue(
    certs_dir: Path,
    identity: Identity,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    days: int = 365,
) -> CertPaths:
    """A certificate and key for ``identity``, signed by the folder's CA,
    valid for ``hosts`` (a node's server names; a user's may be empty)."""
    ca_cert, ca_key = _load_ca(certs_dir)
    cluster_id = ca_cluster_id(certs_dir)
    if identity.cluster_id != cluster_id:
        raise CertError(
            f"the CA in {certs_dir} is cluster {cluster_id}'s, not {identity.cluster_id}'s",
            EXIT_USAGE,
        )
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if identity.node_id is not None:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    names += _san_hosts(hosts)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster_id),
                    x509.NameAttribute(NameOID.COMMON_NAME, identity.principal),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = paths_for(certs_dir, identity)
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def describe_certs(certs_dir: Path) -> list[CertInfo]:
    """Every certificate of the folder, the CA first."""
    if not (certs_dir / CA_CERT).exists():
        raise CertError(f"no CA in {certs_dir} (no {CA_CERT})")
    files = [certs_dir / CA_CERT] + sorted(p for p in certs_dir.glob("*.crt") if p.name != CA_CERT)
    out = []
    for path in files:
        try:
            pem = path.read_bytes()
            cert = x509.load_pem_x509_certificate(pem)
        except (OSError, ValueError) as exc:
            raise CertError(f"{path} is unreadable: {exc}") from None
        if path.name == CA_CERT:
            identity = f"CA of cluster {ca_cluster_id(certs_dir)}"
            hosts: tuple[str, ...] = ()
        else:
            try:
                identity = identity_from_pem(pem).uri
            except IdentityError as exc:
                identity = f"(none: {exc})"
            try:
                san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                hosts = tuple(
                    [*san.get_values_for_type(x509.DNSName)]
                    + [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
                )
            except x509.ExtensionNotFound:
                hosts = ()
        out.append(
            CertInfo(
                path.name,
                identity,
                hosts,
                cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
                cert.issuer.rfc4514_string(),
            )
        )
    return out

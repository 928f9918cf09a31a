"""Mutual TLS for a node's server and its channels, with gRPC's own
credentials.

A node given :class:`TlsFiles` (the cluster's CA, its certificate and key,
as ``kq certs`` writes them) listens with TLS only and requires a client
certificate signed by the CA; its channels to its peers present its
certificate and verify theirs.  The server re-reads its certificate and
key when their files change, so rotating them needs no restart (etcd does
the same): a fetcher gRPC calls on new handshakes compares the files'
modification times.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "TlsError", "TlsFiles", "dial"]

log = logging.getLogger("kq.tls")


class TlsError(ValueError):
    """TLS files that cannot be used (names the file and why)."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_folder(cls, certs_dir: Path, stem: str) -> TlsFiles:
        """``ca.crt`` and ``<stem>.crt``/``.key`` of a ``kq certs`` folder."""
        return cls(certs_dir / "ca.crt", certs_dir / f"{stem}.crt", certs_dir / f"{stem}.key")

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA, certificate, key) as PEM bytes; TlsError naming a missing or
        unreadable file."""
        out = []
        for what, path in (
            ("CA certificate", self.ca),
            ("certificate", self.cert),
            ("key", self.key),
        ):
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise TlsError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
            if b"-----BEGIN" not in data:
                raise TlsError(f"the {what} {path} is not PEM")
            out.append(data)
        return out[0], out[1], out[2]

    def stamp(self) -> tuple[float, ...]:
        """The files' modification times (empty if one is missing): what
        tells a reader that a rotation replaced them."""
        try:
            return tuple(os.stat(p).st_mtime for p in (self.ca, self.cert, self.key))
        except OSError:
            return ()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials that require a client certificate signed by the CA and
        pick up new files on the next handshake after they change."""
        ca, cert, key = self.read()
        loaded = [self.stamp()]

        # gRPC reads None as "unchanged" (its stubs do not say so).
        def fetch() -> Any:
            stamp = self.stamp()
            if not stamp or stamp == loaded[0]:
                return None
            try:
                ca_now, cert_now, key_now = self.read()
            except TlsError as exc:
                log.warning("keeping the current certificate: %s", exc)
                return None
            loaded[0] = stamp
            log.info("loaded the changed certificate %s", self.cert)
            return grpc.ssl_server_certificate_configuration([(key_now, cert_now)], ca_now)

        return grpc.dynamic_ssl_server_credentials(
            grpc.ssl_server_certificate_configuration([(key, cert)], ca),
            fetch,
            require_client_authentication=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self.read()
        return grpc.ssl_channel_credentials(ca, key, cert)

    def matching_channel_credentials(self) -> grpc.ChannelCredentials:
        """:meth:`channel_credentials`, refused (TlsError) while the key is
        not the certificate's: a rotation replaces the two files one rename
        apart, and credentials read in between would fail every handshake
        (the server side keeps its old pair then; gRPC does that for it)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        ca, cert, key = self.read()
        try:
            public = x509.load_pem_x509_certificate(cert).public_key()
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as exc:
            raise TlsError(f"cannot load {self.cert} and {self.key}: {exc}") from None
        if public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ) != private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ):
            raise TlsError(f"the key {self.key} is not the certificate {self.cert}'s")
        return grpc.ssl_channel_credentials(ca, key, cert)


# The largest message a node's server and every channel send or receive
# (node.max_message_bytes); gRPC refuses a larger one RESOURCE_EXHAUSTED.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def dial(
    address: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, Any]] = (),
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.aio.Channel:
    """A channel to ``address``: mutual TLS with ``credentials``
    (:meth:`TlsFiles.channel_credentials`), plaintext without.  It sends and
    receives messages of up to ``max_message_bytes`` (gRPC's own defaults
    are no limit to send and 4 MiB to receive); ``options`` may override."""
    given = {name for name, _ in options}
    limits = [
        (name, max_message_bytes)
        for name in ("grpc.max_send_message_length", "grpc.max_receive_message_length")
        if name not in given
    ]
    merged = limits + list(options)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=merged)
    return grpc.aio.secure_channel(address, credentials, options=merged)

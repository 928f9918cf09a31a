"""What ``kq produce``, ``kq consume`` and ``kq offsets`` share: the flags
that find the brokers and the certificate to present, and the reading of
the clients' errors as exit statuses."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from broker.grpc_client.errors import BrokerClientError, UnknownTopicError
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    add_bootstrap_flag,
    bootstrap_addresses,
)

__all__ = [
    "add_client_flags",
    "broker_bootstrap",
    "chosen_partitions",
    "client_errors",
    "parse_partition",
]


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    add_bootstrap_flag(parser, nodes="brokers", of="the cluster")
    parser.add_argument("--json", action="store_true", help="print JSON")


def broker_bootstrap(args: argparse.Namespace) -> list[str]:
    """``--bootstrap-server``, or the brokers of the local cluster that
    ``kq cluster up`` started in ``--cluster-dir``."""
    if args.bootstrap_server is not None:
        return bootstrap_addresses(args)
    from server.local_cluster import broker_addresses

    addresses = broker_addresses(args.cluster_dir)
    if not addresses:
        raise CommandError(
            "--bootstrap-server is required (no local cluster with brokers in "
            f"{args.cluster_dir}/cluster.json)",
            EXIT_USAGE,
        )
    return addresses


def parse_partition(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a partition number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a partition is >= 0, not {value}")
    return value


def chosen_partitions(
    args: argparse.Namespace, count: int, status: int = EXIT_FAILURE
) -> list[int]:
    """``--partition`` of ``--topic``, which has ``count`` partitions, or
    all of them; a partition it does not have is an error of ``status``."""
    if args.partition is None:
        return list(range(count))
    if args.partition >= count:
        raise CommandError(
            f"topic {args.topic!r} has no partition {args.partition} (it has {count})", status
        )
    return [args.partition]


@contextlib.contextmanager
def client_errors() -> Iterator[None]:
    """A client's refusal as the command's error: a topic that does not
    exist, a broker's error (exit 1, nothing was done)."""
    try:
        yield
    except UnknownTopicError as exc:
        raise CommandError(exc.message, EXIT_FAILURE) from None
    except BrokerClientError as exc:
        raise CommandError(str(exc), EXIT_FAILURE) from None

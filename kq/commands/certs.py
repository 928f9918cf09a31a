"""``kq certs``: a cluster's CA and the certificates of its nodes and users.

kq certs create-ca --certs-dir DIR --cluster-id ID [--days 3650] [--force]
kq certs issue --certs-dir DIR --node ID --role controller|broker [--host H ...] [--days 365]
kq certs issue --certs-dir DIR --user NAME [--days 365]
kq certs list --certs-dir DIR [--json]

Each certificate binds its identity (``kq://<cluster-id>/<role>/<id>``) to
its key; servers read the caller's identity from it (``server/certs.py``
describes the folder).  Exit statuses: 0 done, 1 a folder or CA that cannot
be used, 2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from kq.commands.common import (
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    format_table,
    print_json,
)
from quorum.driver.identity import Identity, IdentityError, Role
from server.certs import DEFAULT_HOSTS, ca_cluster_id, create_ca, describe_certs, issue

__all__ = ["register"]


def _positive_days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of days, got {text!r}") from None
    if days <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {days}")
    return days


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "certs",
        help="create a cluster's CA and its nodes' and users' certificates",
        description="Certificates that bind each node and user of a cluster to its identity.",
    )
    ca = commands.add_parser(
        "create-ca",
        help="create the cluster's CA",
        description="Create the cluster's certificate authority (ca.crt, and ca.key, mode 0600) "
        "in --certs-dir. Refuses to replace an existing CA without --force.",
    )
    ca.add_argument("--certs-dir", required=True, type=Path, metavar="DIR")
    ca.add_argument("--cluster-id", required=True, help="the cluster the CA vouches for")
    ca.add_argument("--days", type=_positive_days, default=3650, help="validity (default 3650)")
    ca.add_argument("--force", action="store_true", help="replace an existing CA")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(func=_create_ca)

    iss = commands.add_parser(
        "issue",
        help="issue a node's or a user's certificate",
        description="Issue a certificate and key signed by the folder's CA, for a node "
        "(--node ID --role controller|broker, valid for its --host names) or a user (--user).",
    )
    iss.add_argument("--certs-dir", required=True, type=Path, metavar="DIR")
    who = iss.add_mutually_exclusive_group(required=True)
    who.add_argument("--node", type=int, metavar="ID", help="a node's id")
    who.add_argument("--user", metavar="NAME", help="a user's name")
    iss.add_argument("--role", choices=[Role.CONTROLLER.value, Role.BROKER.value])
    iss.add_argument(
        "--host",
        action="append",
        metavar="H",
        help=f"a DNS name or IP address the node serves (repeatable; default "
        f"{', '.join(DEFAULT_HOSTS)})",
    )
    iss.add_argument("--days", type=_positive_days, default=365, help="validity (default 365)")
    iss.add_argument("--json", action="store_true", help="print JSON")
    iss.set_defaults(func=_issue)

    listing = commands.add_parser(
        "list", help="the folder's certificates", description="Each certificate of the folder."
    )
    listing.add_argument("--certs-dir", required=True, type=Path, metavar="DIR")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_list)


@command("certs create-ca")
def _create_ca(args: argparse.Namespace) -> int:
    try:
        paths = create_ca(args.certs_dir, args.cluster_id, days=args.days, overwrite=args.force)
    except IdentityError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    if args.json:
        print_json({"cert": str(paths.cert), "key": str(paths.key), "cluster_id": args.cluster_id})
    else:
        print(f"Created the CA of cluster {args.cluster_id}: {paths.cert} (key {paths.key})")
    return 0


@command("certs issue")
def _issue(args: argparse.Namespace) -> int:
    if not (args.certs_dir / "ca.crt").exists():
        raise CommandError(f"no CA in {args.certs_dir}: create one with `kq certs create-ca`")
    cluster_id = ca_cluster_id(args.certs_dir)
    try:
        if args.user is not None:
            if args.role is not None:
                raise CommandError("--role goes with --node, not --user", EXIT_USAGE)
            identity = Identity.user(cluster_id, args.user)
            hosts: tuple[str, ...] = tuple(args.host or ())
        else:
            if args.role is None:
                raise CommandError("--node needs --role controller or broker", EXIT_USAGE)
            identity = Identity.node(cluster_id, Role(args.role), args.node)
            hosts = tuple(args.host or DEFAULT_HOSTS)
    except IdentityError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    paths = issue(args.certs_dir, identity, hosts, days=args.days)
    if args.json:
        print_json({"identity": identity.uri, "cert": str(paths.cert), "key": str(paths.key)})
    else:
        print(f"Issued {identity.uri}: {paths.cert} (key {paths.key})")
    return 0


@command("certs list")
def _list(args: argparse.Namespace) -> int:
    certs = describe_certs(args.certs_dir)
    if args.json:
        print_json([dataclasses.asdict(c) for c in certs])
        return 0
    print(
        format_table(
            ["File", "Identity", "Hosts", "NotAfter"],
            [[c.file, c.identity, ",".join(c.hosts) or "-", c.not_after] for c in certs],
        )
    )
    return 0

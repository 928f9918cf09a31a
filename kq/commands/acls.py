"""``kq acls``: the cluster's ACL bindings, with kafka-acls.sh's options.

kq acls --add --allow-principal User:alice --operation Read --topic orders
kq acls --add --deny-principal User:bob --deny-host 10.0.0.9 --operation All --cluster
kq acls --add --allow-principal User:ci --operation Create --topic team-a. \\
        --resource-pattern-type prefixed
kq acls --list [--topic orders] [--resource-pattern-type match] [--principal User:alice]
kq acls --remove --allow-principal User:alice --operation Read --topic orders --force

The bindings are records of the metadata log (docs/security.md); the caller
needs ALTER on the cluster to add or remove them and DESCRIBE to list them
(a super user has both).  With ``--bootstrap-server``, ``--cluster-dir``,
``--certs-dir``, ``--user``, ``--timeout`` and ``--json``; exit statuses:
see :mod:`kq.commands.admin`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from kq.commands.admin import add_common_flags, call, error_name, linearizable
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    command,
    print_json,
)
from kqproto import metadata_pb2
from metadata.client import AclFilter, MetadataClient, acl_binding, acl_name

__all__ = ["register"]

CLUSTER_NAME = "kafka-cluster"
# kafka-acls.sh's operation names (Read, DescribeConfigs, ...) and kq's
# (READ, DESCRIBE_CONFIGS) alike.
OPERATIONS = {
    name.replace("_", ""): name
    for name in (
        "ALL",
        "READ",
        "WRITE",
        "CREATE",
        "DELETE",
        "ALTER",
        "DESCRIBE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
    )
}
PATTERNS = ("literal", "prefixed", "match", "any")


def _operation(text: str) -> str:
    found = OPERATIONS.get(text.replace("_", "").replace("-", "").upper())
    if found is None:
        known = ", ".join(sorted(OPERATIONS.values()))
        raise argparse.ArgumentTypeError(f"unknown operation {text!r}; one of {known}")
    return found


def _principal(text: str) -> str:
    kind, colon, name = text.partition(":")
    if not colon or not name or kind not in ("User", "Broker", "Controller"):
        raise argparse.ArgumentTypeError(
            f"principal {text!r} is not Type:name (User:alice, User:*, Broker:3)"
        )
    return text


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "acls",
        help="add, remove and list ACL bindings (kafka-acls.sh)",
        description=(
            "The cluster's ACL bindings, as kafka-acls.sh: who (--allow-principal, "
            "--deny-principal) may do what (--operation) from where (--allow-host, "
            "--deny-host) on which resources (--topic, --group, --transactional-id, "
            "--cluster)."
        ),
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--add", action="store_true", help="add the bindings")
    mode.add_argument("--remove", action="store_true", help="remove the bindings")
    mode.add_argument("--list", action="store_true", help="list the bindings")
    parser.add_argument(
        "--allow-principal", action="append", default=[], type=_principal, metavar="PRINCIPAL"
    )
    parser.add_argument(
        "--deny-principal", action="append", default=[], type=_principal, metavar="PRINCIPAL"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="with --allow-principal: the hosts (default: every host, *)",
    )
    parser.add_argument(
        "--deny-host",
        action="append",
        default=[],
        metavar="HOST",
        help="with --deny-principal: the hosts (default: every host, *)",
    )
    parser.add_argument(
        "--operation",
        action="append",
        default=[],
        type=_operation,
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
        "AlterConfigs, IdempotentWrite or All (repeatable; --add's default: All)",
    )
    parser.add_argument("--topic", action="append", default=[], metavar="NAME")
    parser.add_argument("--group", action="append", default=[], metavar="NAME")
    parser.add_argument("--transactional-id", action="append", default=[], metavar="ID")
    parser.add_argument(
        "--cluster", action="store_true", help=f"the cluster resource ({CLUSTER_NAME})"
    )
    parser.add_argument(
        "--resource-pattern-type",
        type=str.lower,
        choices=PATTERNS,
        default=None,
        help="literal (default) or prefixed for --add; also match (what applies to the "
        "names) or any for --list and --remove",
    )
    parser.add_argument(
        "--principal",
        type=_principal,
        help="with --list: only this principal's bindings",
    )
    parser.add_argument(
        "--force", action="store_true", help="with --remove: do not ask for confirmation"
    )
    add_common_flags(parser, stale=True)
    parser.set_defaults(func=_run)


def _resources(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = [("TOPIC", n) for n in args.topic]
    out += [("GROUP", n) for n in args.group]
    out += [("TRANSACTIONAL_ID", n) for n in args.transactional_id]
    if args.cluster:
        out.append(("CLUSTER", CLUSTER_NAME))
    for rtype, name in out:
        if not name:
            raise CommandError(f"an empty {rtype.lower().replace('_', ' ')} name", EXIT_USAGE)
    return out


def _entries(args: argparse.Namespace, default_all: bool) -> list[tuple[str, str, str, str]]:
    """(principal, host, operation, permission) for every combination asked."""
    if args.allow_host and not args.allow_principal:
        raise CommandError("--allow-host needs --allow-principal", EXIT_USAGE)
    if args.deny_host and not args.deny_principal:
        raise CommandError("--deny-host needs --deny-principal", EXIT_USAGE)
    operations = args.operation or (["ALL"] if default_all else [])
    out = []
    for permission, principals, hosts in (
        ("ALLOW", args.allow_principal, args.allow_host or ["*"]),
        ("DENY", args.deny_principal, args.deny_host or ["*"]),
    ):
        for principal, host, op in itertools.product(principals, hosts, operations):
            out.append((principal, host, op, permission))
    return out


def _binding_json(b: metadata_pb2.AclBinding) -> dict[str, Any]:
    return {
        "resource_type": acl_name(metadata_pb2.AclResourceType, b.resource_type),
        "resource_name": b.resource_name,
        "pattern_type": acl_name(metadata_pb2.AclPatternType, b.pattern_type),
        "principal": b.principal,
        "host": b.host,
        "operation": acl_name(metadata_pb2.AclOperation, b.operation),
        "permission": acl_name(metadata_pb2.AclPermissionType, b.permission),
    }


def _print_bindings(stored: list[metadata_pb2.StoredAcl]) -> None:
    """kafka-acls.sh's listing: the bindings grouped by resource pattern."""
    by_pattern: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for s in stored:
        j = _binding_json(s.binding)
        key = (j["resource_type"], j["resource_name"], j["pattern_type"])
        by_pattern.setdefault(key, []).append(j)
    for (rtype, name, pattern), entries in sorted(by_pattern.items()):
        print(
            f"Current ACLs for resource `ResourcePattern(resourceType={rtype}, name={name}, "
            f"patternType={pattern})`:"
        )
        for j in sorted(entries, key=lambda e: (e["principal"], e["host"], e["operation"])):
            print(
                f" \t(principal={j['principal']}, host={j['host']}, "
                f"operation={j['operation']}, permissionType={j['permission']})"
            )
        print()


@command("acls")
def _run(args: argparse.Namespace) -> int:
    resources = _resources(args)
    pattern = args.resource_pattern_type
    if args.add:
        return _add(args, resources, pattern or "literal")
    if args.remove:
        return _remove(args, resources, pattern or "literal")
    return _list(args, resources, pattern)


def _add(args: argparse.Namespace, resources: list[tuple[str, str]], pattern: str) -> int:
    if pattern not in ("literal", "prefixed"):
        raise CommandError(f"--add needs a literal or prefixed pattern, not {pattern}", EXIT_USAGE)
    if not resources:
        raise CommandError(
            "--add needs a resource: --topic, --group, --transactional-id or --cluster",
            EXIT_USAGE,
        )
    entries = _entries(args, default_all=True)
    if not entries:
        raise CommandError("--add needs --allow-principal or --deny-principal", EXIT_USAGE)
    try:
        bindings = [
            acl_binding(rtype, name, principal, op, permission, host=host, pattern_type=pattern)
            for (rtype, name), (principal, host, op, permission) in itertools.product(
                resources, entries
            )
        ]
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    response = call(args, lambda c: c.create_acls(bindings))
    failed = [(b, r) for b, r in zip(bindings, response.results, strict=True) if r.error != 0]
    if args.json:
        print_json(
            {
                "ok": not failed,
                "results": [
                    {
                        **_binding_json(b),
                        "error": error_name(r.error) if r.error else None,
                        "message": r.message,
                    }
                    for b, r in zip(bindings, response.results, strict=True)
                ],
            }
        )
    else:
        for b, r in zip(bindings, response.results, strict=True):
            j = _binding_json(b)
            what = (
                f"{j['principal']} {j['permission']} {j['operation']} from {j['host']} on "
                f"{j['resource_type']} {j['resource_name']} ({j['pattern_type'].lower()})"
            )
            if r.error:
                print(f"Not added: {what}: {error_name(r.error)}: {r.message}", file=sys.stderr)
            else:
                print(f"Added: {what}")
    return EXIT_FAILURE if failed else 0


def _filters(
    args: argparse.Namespace, resources: list[tuple[str, str]], pattern: str
) -> list[AclFilter]:
    entries = _entries(args, default_all=False)
    pattern_type = pattern.upper()
    targets: list[tuple[str, str | None]] = list(resources) or [("ANY", None)]
    if not entries:
        # kafka-acls.sh --remove with no principal: every binding of the
        # resources (of the operations given, if any).
        ops = args.operation or ["ANY"]
        return [
            AclFilter(rtype, name, pattern_type, operation=op)
            for (rtype, name), op in itertools.product(targets, ops)
        ]
    return [
        AclFilter(rtype, name, pattern_type, principal, host, op, permission)
        for (rtype, name), (principal, host, op, permission) in itertools.product(targets, entries)
    ]


def _remove(args: argparse.Namespace, resources: list[tuple[str, str]], pattern: str) -> int:
    if not resources:
        raise CommandError(
            "--remove needs a resource: --topic, --group, --transactional-id or --cluster",
            EXIT_USAGE,
        )
    filters = _filters(args, resources, pattern)
    if not args.force:
        if not sys.stdin.isatty():
            raise CommandError("--remove asks for confirmation; pass --force", EXIT_USAGE)
        names = ", ".join(f"{t} {n}" for t, n in resources)
        answer = input(f"Are you sure you want to remove ACLs on {names}? (y/n) ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing removed.")
            return 0
    response = call(args, lambda c: c.delete_acls(filters))
    removed = [s for r in response.results for s in r.deleted]
    refused = [r for r in response.results if r.error]
    if args.json:
        print_json(
            {
                "ok": not refused,
                "removed": [{"id": s.id, **_binding_json(s.binding)} for s in removed],
                "errors": [{"error": error_name(r.error), "message": r.message} for r in refused],
            }
        )
    else:
        for r in refused:
            print(f"{error_name(r.error)}: {r.message}", file=sys.stderr)
        print(f"Removed {len(removed)} ACL binding(s).")
        _print_bindings(removed)
    return EXIT_FAILURE if refused else 0


def _describe(
    f: AclFilter, args: argparse.Namespace
) -> Callable[[MetadataClient], Awaitable[metadata_pb2.DescribeAclsResponse]]:
    return lambda c: c.describe_acls(f, linearizable=linearizable(args))


def _list(args: argparse.Namespace, resources: list[tuple[str, str]], pattern: str | None) -> int:
    if _entries(args, default_all=False) or args.operation:
        raise CommandError(
            "--list takes --principal and resources, not --allow-/--deny- or --operation",
            EXIT_USAGE,
        )
    # Without a resource, every binding; with resources, kafka-acls.sh's
    # default pattern type (literal) unless another is given.
    targets: list[tuple[str, str | None]] = list(resources) or [("ANY", None)]
    pattern_type = (pattern or ("literal" if resources else "any")).upper()
    stored: dict[str, metadata_pb2.StoredAcl] = {}
    for rtype, name in targets:
        response = call(args, _describe(AclFilter(rtype, name, pattern_type, args.principal), args))
        for s in response.acls:
            stored[s.id] = s
    found = sorted(stored.values(), key=lambda s: s.id)
    if args.json:
        print_json({"acls": [{"id": s.id, **_binding_json(s.binding)} for s in found]})
    else:
        _print_bindings(found)
    return 0

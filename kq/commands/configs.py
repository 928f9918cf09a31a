"""``kq configs``: describe and alter configs (kafka-configs.sh).

kq configs describe --entity-type topics|brokers|cluster [--entity-name X] [--all]
kq configs alter --entity-type topics|brokers|cluster [--entity-name X]
    [--add-config K=V,K2=V2] [--delete-config K,K2]
    [--if-value K=V ...] [--if-absent K ...] [--validate-only]

``--if-value K=V`` makes the change conditional: it is applied only if K's
current value on the entity is V (``--if-absent K``: only if K has none),
checked and written atomically by the active controller; otherwise nothing
is changed and the current value is printed.  With ``--bootstrap``,
``--timeout`` and ``--json``; exit statuses: see :mod:`kq.commands.admin`.
"""

from __future__ import annotations

import argparse

from kq.commands.admin import (
    add_common_flags,
    broker_id,
    call,
    config_list,
    config_pair,
    error_name,
    key_list,
    linearizable,
    usage,
)
from kq.commands.common import (
    EXIT_FAILURE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    print_json,
)
from kqproto import metadata_pb2
from metadata.client import ConfigOp, ConfigResource, MetadataClient, error_code
from metadata.errors import Errors

__all__ = ["build_ops", "describe_text", "register", "resource_label"]

ENTITY_TYPES = {
    "topics": metadata_pb2.TOPIC,
    "brokers": metadata_pb2.BROKER,
    "cluster": metadata_pb2.CLUSTER,
}


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "configs",
        help="describe and alter topic, broker and cluster configs",
        description=(
            "Configs of topics, brokers and the cluster, as kafka-configs.sh. A topic "
            "config not set on the topic comes from the cluster's value of its broker-level "
            "synonym (log.retention.ms for retention.ms), then the default."
        ),
    )

    describe = commands.add_parser(
        "describe",
        help="print the configs set on an entity (--all: every config in force)",
        description=(
            "Print the configs set on the entity (without --entity-name: on every topic, "
            "or every registered broker). --all prints every config of the entity with "
            "the value in force and where it comes from."
        ),
    )
    _entity_flags(describe)
    describe.add_argument(
        "--all", action="store_true", help="every config in force, defaults included"
    )
    add_common_flags(describe, stale=True)
    describe.set_defaults(func=_describe)

    alter = commands.add_parser(
        "alter",
        help="set or delete configs of an entity, optionally conditionally",
        description=(
            "Set (--add-config) or delete (--delete-config) configs of one entity, "
            "all or nothing. --if-value K=V / --if-absent K make it conditional on the "
            "current value of a key being changed: if any condition fails nothing is "
            "changed and the current value is printed (exit 1)."
        ),
    )
    _entity_flags(alter)
    alter.add_argument(
        "--add-config",
        type=config_list,
        action="append",
        default=[],
        metavar="K=V[,K=V...]",
        help="configs to set; a value with commas goes in brackets: k=[a,b]",
    )
    alter.add_argument(
        "--delete-config",
        type=key_list,
        action="append",
        default=[],
        metavar="K[,K...]",
        help="configs to delete (the inherited value applies again)",
    )
    alter.add_argument(
        "--if-value",
        type=config_pair,
        action="append",
        default=[],
        metavar="K=V",
        help="change only if K currently is V on the entity (repeatable)",
    )
    alter.add_argument(
        "--if-absent",
        action="append",
        default=[],
        metavar="K",
        help="change only if K currently has no value on the entity (repeatable)",
    )
    alter.add_argument(
        "--validate-only", action="store_true", help="check the request; change nothing"
    )
    add_common_flags(alter)
    alter.set_defaults(func=_alter)


def _entity_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--entity-type",
        required=True,
        choices=sorted(ENTITY_TYPES),
        help="what the configs belong to",
    )
    parser.add_argument(
        "--entity-name",
        metavar="NAME",
        help="the topic's name or the broker's id (not for the cluster)",
    )


def _resource(args: argparse.Namespace, *, name_required: bool) -> ConfigResource | None:
    """The entity named; None when no name is given (and none is required)."""
    rtype = ENTITY_TYPES[args.entity_type]
    name: str | None = args.entity_name
    if rtype == metadata_pb2.CLUSTER:
        if name is not None:
            usage("--entity-name is not used with --entity-type cluster")
        return ConfigResource.cluster()
    if name is None:
        if name_required:
            usage(f"--entity-type {args.entity_type} needs --entity-name")
        return None
    if rtype == metadata_pb2.BROKER:
        try:
            return ConfigResource.broker(broker_id(name))
        except argparse.ArgumentTypeError as exc:
            usage(f"--entity-name: {exc}")
    if not name:
        usage("--entity-name must not be empty")
    return ConfigResource.topic(name)


def resource_label(rtype: int, name: str) -> str:
    if rtype == metadata_pb2.CLUSTER:
        return "the cluster"
    if rtype == metadata_pb2.BROKER:
        return f"broker {name}"
    return f"topic {name}"


def _type_name(rtype: int) -> str:
    return metadata_pb2.ConfigResourceType.Name(rtype).lower()


def describe_text(result: metadata_pb2.DescribeConfigsResult, include_defaults: bool) -> list[str]:
    what = "All" if include_defaults else "Dynamic"
    lines = [f"{what} configs for {resource_label(result.type, result.name)} are:"]
    for entry in sorted(result.entries, key=lambda e: e.name):
        source = metadata_pb2.ConfigSource.Name(entry.source)
        lines.append(f"  {entry.name}={entry.value} source={source}")
    return lines


@command("configs describe")
def _describe(args: argparse.Namespace) -> int:
    one = _resource(args, name_required=False)
    rtype = ENTITY_TYPES[args.entity_type]

    async def fetch(client: MetadataClient) -> metadata_pb2.DescribeConfigsResponse:
        if one is not None:
            resources = [one]
        elif rtype == metadata_pb2.TOPIC:
            listing = await client.list_topics(linearizable=linearizable(args))
            names = sorted(t.name for t in listing.topics)
            resources = [ConfigResource.topic(name) for name in names]
        else:
            cluster = await client.describe_cluster(linearizable=linearizable(args))
            brokers = sorted(b.broker_id for b in cluster.brokers)
            resources = [ConfigResource.broker(b) for b in brokers]
        if not resources:
            return metadata_pb2.DescribeConfigsResponse()
        return await client.describe_configs(
            resources, include_defaults=args.all, linearizable=linearizable(args)
        )

    response = call(args, fetch)
    failures = [r for r in response.results if error_code(r.error) is not Errors.NONE]
    shown = [r for r in response.results if error_code(r.error) is Errors.NONE]
    if args.json:
        print_json(
            {
                "resources": [
                    {
                        "type": _type_name(r.type),
                        "name": r.name,
                        "error": error_name(r.error),
                        "message": r.message,
                        "configs": [
                            {
                                "name": e.name,
                                "value": e.value,
                                "source": metadata_pb2.ConfigSource.Name(e.source),
                            }
                            for e in sorted(r.entries, key=lambda e: e.name)
                        ],
                    }
                    for r in response.results
                ],
                "metadata_offset": response.metadata_offset,
            }
        )
    else:
        for r in shown:
            for line in describe_text(r, args.all):
                print(line)
    if failures:
        raise CommandError(
            "\n".join(
                f"{error_name(r.error)}: {r.message or resource_label(r.type, r.name)}"
                for r in failures
            ),
            EXIT_FAILURE,
        )
    return 0


def build_ops(
    adds: list[tuple[str, str]],
    deletes: list[str],
    if_value: list[tuple[str, str]],
    if_absent: list[str],
) -> list[ConfigOp]:
    """The ops of ``kq configs alter``'s flags; a usage error names a conflict."""
    changes: dict[str, str | None] = {}
    for key, value in adds:
        if key in changes:
            usage(f"config {key} is set twice")
        changes[key] = value
    for key in deletes:
        if key in changes:
            usage(
                f"config {key} is both set and deleted"
                if changes[key] is not None
                else f"config {key} is deleted twice"
            )
        changes[key] = None
    if not changes:
        usage("nothing to change: give --add-config and/or --delete-config")
    expected: dict[str, str | None] = {}
    for key, value in if_value:
        if key in expected:
            usage(f"two conditions on config {key}")
        expected[key] = value
    for key in if_absent:
        key = key.strip()
        if key in expected:
            usage(f"two conditions on config {key}")
        expected[key] = None
    for key in expected:
        if key not in changes:
            usage(
                f"a condition on config {key}, which is not changed: conditions apply to "
                "keys given to --add-config or --delete-config"
            )
    return [
        ConfigOp(
            key,
            value,
            expected=expected.get(key),
            expect_absent=key in expected and expected[key] is None,
        )
        for key, value in changes.items()
    ]


@command("configs alter")
def _alter(args: argparse.Namespace) -> int:
    resource = _resource(args, name_required=True)
    assert resource is not None
    ops = build_ops(
        [pair for group in args.add_config for pair in group],
        [key for group in args.delete_config for key in group],
        args.if_value,
        args.if_absent,
    )
    response = call(
        args,
        lambda c: c.alter_configs({resource: ops}, validate_only=args.validate_only),
    )
    label = resource_label(resource.type, resource.name)
    failures = [r for r in response.results if error_code(r.error) is not Errors.NONE]
    if args.json:
        print_json(
            {
                "ok": not failures,
                "validate_only": args.validate_only,
                "resources": [
                    {
                        "type": _type_name(r.type),
                        "name": r.name,
                        "error": error_name(r.error),
                        "message": r.message,
                        "current": [
                            {"key": c.key, "present": c.present, "value": c.value}
                            if c.present
                            else {"key": c.key, "present": False}
                            for c in r.current
                        ],
                    }
                    for r in response.results
                ],
            }
        )
    if failures:
        lines: list[str] = []
        for r in failures:
            line = f"{error_name(r.error)}: {r.message or resource_label(r.type, r.name)}"
            found = [
                f"{c.key} is {c.value!r}" if c.present else f"{c.key} has no value"
                for c in r.current
            ]
            if found:
                line += f" (now: {'; '.join(found)})"
            lines.append(line)
        lines.append(f"nothing was changed on {label}")
        raise CommandError("\n".join(lines), EXIT_FAILURE)
    if not args.json:
        if args.validate_only:
            print(f"Validated the config changes for {label} (validate only: nothing was changed).")
        else:
            print(f"Completed updating config for {label}.")
    return 0

"""``kq topics``: create, list, describe, delete and grow topics (kafka-topics.sh).

kq topics create NAME [--partitions N] [--replication-factor R]
    [--config K=V ...] [--replica-assignment 1:2:3,2:3:1] [--if-not-exists]
    [--validate-only]
kq topics list
kq topics describe [NAME ...] [--under-replicated-partitions]
    [--unavailable-partitions]
kq topics delete NAME ... [--if-exists]
kq topics add-partitions NAME --partitions N [--replica-assignment 4:5,5:6]

with ``--bootstrap H:P[,H:P...]``, ``--timeout SECONDS`` and ``--json`` (and
``--stale`` for list and describe).  Exit statuses: see
:mod:`kq.commands.admin`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from kq.commands.admin import (
    add_common_flags,
    call,
    config_pair,
    error_name,
    fail,
    ids,
    linearizable,
    positive_int,
    replica_assignment,
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
from metadata.client import MetadataClient, NewPartitions, NewTopic, error_code
from metadata.errors import Errors

__all__ = [
    "describe_lines",
    "is_unavailable",
    "is_under_replicated",
    "partition_json",
    "register",
    "replication_factor",
    "topic_json",
]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "topics",
        help="create, list, describe, delete and add partitions to topics",
        description=(
            "Topics of the cluster, as kafka-topics.sh. Requests go to the active "
            "controller (found from any --bootstrap controller). Exit status: 0 done, "
            "1 refused (the error is printed) or no controller answered, 2 usage, "
            "3 indeterminate (the change may or may not have been applied)."
        ),
    )

    create = commands.add_parser(
        "create",
        help="create a topic",
        description=(
            "Create topic NAME. Without --partitions / --replication-factor the cluster's "
            "num.partitions / default.replication.factor apply. --replica-assignment places "
            "every partition explicitly (partitions separated by commas, the broker ids of "
            "each by colons, the first the preferred leader) and excludes both."
        ),
    )
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=positive_int, metavar="N")
    create.add_argument("--replication-factor", type=positive_int, metavar="R")
    create.add_argument(
        "--config",
        type=config_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config override (repeatable)",
    )
    create.add_argument(
        "--replica-assignment", type=replica_assignment, metavar="B:B:B,B:B:B", default=None
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="succeed if the topic already exists"
    )
    create.add_argument(
        "--validate-only", action="store_true", help="check the request; create nothing"
    )
    add_common_flags(create)
    create.set_defaults(func=_create)

    listing = commands.add_parser("list", help="list the topics' names")
    add_common_flags(listing, stale=True)
    listing.set_defaults(func=_list)

    describe = commands.add_parser(
        "describe",
        help="describe topics and their partitions",
        description=(
            "Describe the topics named (default: every topic) as kafka-topics.sh "
            "--describe does: a line per topic, then a line per partition with its "
            "leader, replicas, in-sync replicas, eligible leader replicas and last known "
            "ones (KIP-966) and, during a reassignment, the replicas being added and "
            "removed; and, where any, its offline replicas (on fenced or unregistered "
            "brokers), which kafka-topics.sh leaves out. The filters print only the "
            "matching partitions."
        ),
    )
    describe.add_argument("names", nargs="*", metavar="NAME")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions with fewer in-sync replicas than the replication factor",
    )
    describe.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="only partitions without a leader on a live (unfenced) broker",
    )
    add_common_flags(describe, stale=True)
    describe.set_defaults(func=_describe)

    delete = commands.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.add_argument("--if-exists", action="store_true", help="ignore topics that do not exist")
    add_common_flags(delete)
    delete.set_defaults(func=_delete)

    grow = commands.add_parser(
        "add-partitions",
        help="raise a topic's partition count",
        description=(
            "Raise topic NAME's partition count to N (the new total). "
            "--replica-assignment places the new partitions only, in order."
        ),
    )
    grow.add_argument("name", metavar="NAME")
    grow.add_argument(
        "--partitions", type=positive_int, required=True, metavar="N", help="the new total"
    )
    grow.add_argument("--replica-assignment", type=replica_assignment, metavar="B:B,B:B")
    grow.add_argument(
        "--validate-only", action="store_true", help="check the request; change nothing"
    )
    add_common_flags(grow)
    grow.set_defaults(func=_add_partitions)


# -- create ---------------------------------------------------------------------------


@command("topics create")
def _create(args: argparse.Namespace) -> int:
    configs: dict[str, str] = {}
    for key, value in args.config:
        if key in configs:
            usage(f"--config {key} is given twice")
        configs[key] = value
    assignment: list[list[int]] | None = args.replica_assignment
    if assignment is not None and (
        args.partitions is not None or args.replication_factor is not None
    ):
        usage("--replica-assignment cannot be combined with --partitions or --replication-factor")
    topic = NewTopic(
        name=args.name,
        num_partitions=-1 if args.partitions is None else args.partitions,
        replication_factor=-1 if args.replication_factor is None else args.replication_factor,
        assignments=dict(enumerate(assignment or [])),
        configs=configs,
    )
    response = call(args, lambda c: c.create_topics([topic], validate_only=args.validate_only))
    if len(response.topics) != 1:
        fail(args, "UNKNOWN_SERVER_ERROR", f"expected 1 result, got {len(response.topics)}")
    r = response.topics[0]
    exists_ok = error_code(r.error) is Errors.TOPIC_ALREADY_EXISTS and args.if_not_exists
    ok = error_code(r.error) is Errors.NONE or exists_ok
    if args.json:
        print_json(
            {
                "ok": ok,
                "name": r.name,
                "topic_id": r.topic_id,
                "error": error_name(r.error),
                "message": r.message,
                "num_partitions": r.num_partitions,
                "replication_factor": r.replication_factor,
                "validate_only": args.validate_only,
            }
        )
    if not ok:
        raise CommandError(f"{error_name(r.error)}: {r.message}", EXIT_FAILURE)
    if not args.json and error_code(r.error) is Errors.NONE:
        if args.validate_only:
            print(
                f"Topic {r.name} can be created with {r.num_partitions} partitions and "
                f"replication factor {r.replication_factor} (validate only: nothing was created)."
            )
        else:
            print(f"Created topic {r.name}.")
    return 0


# -- list -----------------------------------------------------------------------------


@command("topics list")
def _list(args: argparse.Namespace) -> int:
    response = call(args, lambda c: c.list_topics(linearizable=linearizable(args)))
    topics = sorted(response.topics, key=lambda t: t.name)
    if args.json:
        print_json([{"name": t.name, "topic_id": t.topic_id} for t in topics])
    else:
        for t in topics:
            print(t.name)
    return 0


# -- describe -------------------------------------------------------------------------


def replication_factor(topic: metadata_pb2.TopicDescription) -> int:
    """As kafka-topics.sh: the first partition's replicas, less those being
    added by a reassignment."""
    if not topic.partitions:
        return 0
    first = min(topic.partitions, key=lambda p: p.partition)
    return len(first.replicas) - len(first.adding_replicas)


def is_under_replicated(p: metadata_pb2.PartitionDescription) -> bool:
    return len(p.isr) < len(p.replicas) - len(p.adding_replicas)


def is_unavailable(p: metadata_pb2.PartitionDescription, live: set[int] | None) -> bool:
    """No leader, or (``live`` known) a leader that is not a live broker."""
    return p.leader < 0 or (live is not None and p.leader not in live)


def _configs_text(configs: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(configs.items()))


def describe_lines(
    topic: metadata_pb2.TopicDescription,
    *,
    partitions: Sequence[metadata_pb2.PartitionDescription] | None = None,
    header: bool = True,
) -> list[str]:
    """kafka-topics.sh --describe's lines for ``topic``: the topic line
    (``header``), then one per partition (``partitions``, default all)."""
    lines: list[str] = []
    if header:
        lines.append(
            f"Topic: {topic.name}\tTopicId: {topic.topic_id}\t"
            f"PartitionCount: {len(topic.partitions)}\t"
            f"ReplicationFactor: {replication_factor(topic)}\t"
            f"Configs: {_configs_text(dict(topic.configs))}"
        )
    shown = topic.partitions if partitions is None else partitions
    for p in sorted(shown, key=lambda p: p.partition):
        line = (
            f"\tTopic: {topic.name}\tPartition: {p.partition}\t"
            f"Leader: {p.leader if p.leader >= 0 else 'none'}\t"
            f"Replicas: {ids(p.replicas)}\tIsr: {ids(p.isr)}"
        )
        if p.adding_replicas or p.removing_replicas:
            line += (
                f"\tAdding Replicas: {ids(p.adding_replicas)}"
                f"\tRemoving Replicas: {ids(p.removing_replicas)}"
            )
        # KIP-966, where kafka-topics.sh (4.x) prints them.
        line += f"\tElr: {ids(p.eligible_leader_replicas)}"
        line += f"\tLastKnownElr: {ids(p.last_known_elr)}"
        # Replicas on brokers that are fenced or unregistered, where any: the
        # Metadata response's offline_replicas, which kafka-topics.sh does
        # not print (its TopicPartitionInfo drops them).
        if p.offline_replicas:
            line += f"\tOffline: {ids(p.offline_replicas)}"
        if p.leader_recovering:
            line += "\tLeaderRecovering: true"
        lines.append(line)
    return lines


def partition_json(p: metadata_pb2.PartitionDescription) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "leader": p.leader if p.leader >= 0 else None,
        "leader_epoch": p.leader_epoch,
        "partition_epoch": p.partition_epoch,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
        "elr": list(p.eligible_leader_replicas),
        "last_known_elr": list(p.last_known_elr),
        "offline_replicas": list(p.offline_replicas),
        "adding_replicas": list(p.adding_replicas),
        "removing_replicas": list(p.removing_replicas),
        "leader_recovering": p.leader_recovering,
    }


def topic_json(
    topic: metadata_pb2.TopicDescription,
    partitions: Sequence[metadata_pb2.PartitionDescription] | None = None,
) -> dict[str, Any]:
    shown = topic.partitions if partitions is None else partitions
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "partition_count": len(topic.partitions),
        "replication_factor": replication_factor(topic),
        "configs": dict(sorted(topic.configs.items())),
        "partitions": [partition_json(p) for p in sorted(shown, key=lambda p: p.partition)],
    }


@command("topics describe")
def _describe(args: argparse.Namespace) -> int:
    names: list[str] = list(dict.fromkeys(args.names))
    filtered = args.under_replicated_partitions or args.unavailable_partitions

    async def fetch(
        client: MetadataClient,
    ) -> tuple[metadata_pb2.DescribeTopicsResponse, set[int] | None]:
        topics = await client.describe_topics(names, linearizable=linearizable(args))
        live: set[int] | None = None
        if args.unavailable_partitions:
            cluster = await client.describe_cluster(linearizable=linearizable(args))
            live = {b.broker_id for b in cluster.brokers if not b.fenced}
        return topics, live

    response, live = call(args, fetch)
    found = [t for t in response.topics if error_code(t.error) is Errors.NONE]
    missing = [t for t in response.topics if error_code(t.error) is not Errors.NONE]
    out: list[dict[str, Any]] = []
    lines: list[str] = []
    for topic in sorted(found, key=lambda t: t.name) if not names else found:
        if filtered:
            chosen = [
                p
                for p in topic.partitions
                if (args.under_replicated_partitions and is_under_replicated(p))
                or (args.unavailable_partitions and is_unavailable(p, live))
            ]
            if chosen:
                out.append(topic_json(topic, chosen))
                lines.extend(describe_lines(topic, partitions=chosen, header=False))
        else:
            out.append(topic_json(topic))
            lines.extend(describe_lines(topic))
    if args.json:
        print_json(
            {
                "topics": out,
                "errors": [
                    {"name": t.name, "error": error_name(t.error), "message": t.message}
                    for t in missing
                ],
                "metadata_offset": response.metadata_offset,
            }
        )
    else:
        for line in lines:
            print(line)
    if missing:
        raise CommandError(
            "\n".join(f"{error_name(t.error)}: {t.message or t.name}" for t in missing),
            EXIT_FAILURE,
        )
    return 0


# -- delete ---------------------------------------------------------------------------


@command("topics delete")
def _delete(args: argparse.Namespace) -> int:
    names: list[str] = list(dict.fromkeys(args.names))
    response = call(args, lambda c: c.delete_topics(names))
    failures: list[str] = []
    results: list[dict[str, Any]] = []
    for r in response.topics:
        skipped = error_code(r.error) is Errors.UNKNOWN_TOPIC_OR_PARTITION and args.if_exists
        ok = error_code(r.error) is Errors.NONE
        results.append(
            {
                "name": r.name,
                "topic_id": r.topic_id,
                "deleted": ok,
                "error": error_name(r.error),
                "message": r.message,
            }
        )
        if ok:
            if not args.json:
                print(f"Deleted topic {r.name}.")
        elif not skipped:
            failures.append(f"{error_name(r.error)}: {r.message or r.name}")
    if args.json:
        print_json({"ok": not failures, "topics": results})
    if failures:
        raise CommandError("\n".join(failures), EXIT_FAILURE)
    return 0


# -- add-partitions -------------------------------------------------------------------


@command("topics add-partitions")
def _add_partitions(args: argparse.Namespace) -> int:
    assignment: list[list[int]] | None = args.replica_assignment

    async def grow(client: MetadataClient) -> metadata_pb2.CreatePartitionsResponse:
        placed: dict[int, list[int]] = {}
        if assignment is not None:
            # Explicit replicas for the new partitions, which start at the
            # current count.
            current = await client.describe_topics([args.name])
            topic = current.topics[0] if current.topics else None
            if topic is None or error_code(topic.error) is not Errors.NONE:
                code = error_name(topic.error) if topic is not None else "UNKNOWN_SERVER_ERROR"
                fail(args, code, topic.message if topic is not None else "no answer for the topic")
            first = len(topic.partitions)
            if first + len(assignment) != args.partitions:
                usage(
                    f"--replica-assignment places {len(assignment)} partitions, but going "
                    f"from {first} to {args.partitions} partitions adds "
                    f"{args.partitions - first}"
                )
            placed = {first + i: r for i, r in enumerate(assignment)}
        return await client.create_partitions(
            [NewPartitions(args.name, args.partitions, placed)],
            validate_only=args.validate_only,
        )

    response = call(args, grow)
    if len(response.topics) != 1:
        fail(args, "UNKNOWN_SERVER_ERROR", f"expected 1 result, got {len(response.topics)}")
    r = response.topics[0]
    ok = error_code(r.error) is Errors.NONE
    if args.json:
        print_json(
            {
                "ok": ok,
                "name": r.name,
                "partitions": args.partitions,
                "error": error_name(r.error),
                "message": r.message,
                "validate_only": args.validate_only,
            }
        )
    if not ok:
        raise CommandError(f"{error_name(r.error)}: {r.message}", EXIT_FAILURE)
    if not args.json:
        if args.validate_only:
            print(
                f"Topic {r.name} can have {args.partitions} partitions "
                "(validate only: nothing was changed)."
            )
        else:
            print(f"Topic {r.name} now has {args.partitions} partitions.")
    return 0

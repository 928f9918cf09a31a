"""``kq leader-election``: elect partition leaders (kafka-leader-election.sh).

kq leader-election --type preferred|unclean
    (--all-topic-partitions | --topic T [--partition P])

PREFERRED moves leadership back to each partition's preferred (first)
replica where it is in sync; UNCLEAN elects a leader for partitions that have
none, from outside the ISR if need be (committed data may be lost).  With
``--bootstrap``, ``--timeout`` and ``--json``; exit statuses: see
:mod:`kq.commands.admin` (1 also if any election failed).
"""

from __future__ import annotations

import argparse

from kq.commands.admin import add_common_flags, call, error_name, fail, non_negative_int
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    command,
    print_json,
)
from kqproto import metadata_pb2
from metadata.client import MetadataClient, TopicPartition, error_code
from metadata.errors import Errors

__all__ = ["outcome_lines", "register"]

TYPES = {"preferred": metadata_pb2.PREFERRED, "unclean": metadata_pb2.UNCLEAN}


def register(subparsers: Subparsers) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "leader-election",
        help="elect preferred or unclean partition leaders",
        description=(
            "Elect partition leaders, as kafka-leader-election.sh. --type preferred makes "
            "each partition's first replica its leader where it is in sync; --type unclean "
            "elects a leader for partitions without one, from outside the ISR if need be "
            "(committed data may be lost)."
        ),
    )
    parser.add_argument(
        "--type",
        "--election-type",
        dest="election_type",
        required=True,
        type=str.lower,
        choices=sorted(TYPES),
        help="the kind of election",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--all-topic-partitions",
        action="store_true",
        help="every partition the election applies to",
    )
    which.add_argument("--topic", metavar="T", help="the partitions of topic T")
    parser.add_argument(
        "--partition", type=non_negative_int, metavar="P", help="only partition P (with --topic)"
    )
    add_common_flags(parser)
    parser.set_defaults(func=_elect)


def outcome_lines(
    kind: str, results: list[metadata_pb2.PartitionResult]
) -> tuple[list[str], list[str]]:
    """kafka-leader-election.sh's report: (lines for stdout, failures)."""
    done = [r for r in results if error_code(r.error) is Errors.NONE]
    not_needed = [r for r in results if error_code(r.error) is Errors.ELECTION_NOT_NEEDED]
    failed = [
        r for r in results if error_code(r.error) not in (Errors.NONE, Errors.ELECTION_NOT_NEEDED)
    ]

    def names(rs: list[metadata_pb2.PartitionResult]) -> str:
        return ", ".join(f"{r.topic}-{r.partition}" for r in rs)

    out: list[str] = []
    if done:
        out.append(f"Successfully completed leader election ({kind}) for partitions {names(done)}")
    if not_needed:
        out.append(f"Valid replica already elected for partitions {names(not_needed)}")
    if not results:
        out.append(f"No partition needed a leader election ({kind}).")
    errors = [
        f"Error completing leader election ({kind}) for partition: {r.topic}-{r.partition}: "
        f"{error_name(r.error)}: {r.message}"
        for r in failed
    ]
    return out, errors


@command("leader-election")
def _elect(args: argparse.Namespace) -> int:
    if args.partition is not None and args.topic is None:
        raise CommandError("--partition needs --topic", EXIT_USAGE)
    election = TYPES[args.election_type]
    kind = args.election_type.upper()

    async def elect(client: MetadataClient) -> metadata_pb2.ElectLeadersResponse:
        partitions: list[TopicPartition] = []
        if args.topic is not None and args.partition is not None:
            partitions = [TopicPartition(args.topic, args.partition)]
        elif args.topic is not None:
            described = await client.describe_topics([args.topic])
            topic = described.topics[0] if described.topics else None
            if topic is None or error_code(topic.error) is not Errors.NONE:
                fail(
                    args,
                    error_name(topic.error) if topic is not None else "UNKNOWN_SERVER_ERROR",
                    topic.message if topic is not None else "no answer for the topic",
                )
            partitions = [
                TopicPartition(args.topic, p.partition)
                for p in sorted(topic.partitions, key=lambda p: p.partition)
            ]
            if not partitions:
                # An empty list would ask for every partition of the cluster.
                fail(args, "UNKNOWN_TOPIC_OR_PARTITION", f"topic {args.topic} has no partition")
        return await client.elect_leaders(election, partitions)

    response = call(args, elect)
    results = list(response.results)
    out, errors = outcome_lines(kind, results)
    if args.json:
        print_json(
            {
                "ok": not errors,
                "type": kind,
                "results": [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "error": error_name(r.error),
                        "message": r.message,
                    }
                    for r in results
                ],
            }
        )
    else:
        for line in out:
            print(line)
    if errors:
        raise CommandError("\n".join(errors), EXIT_FAILURE)
    return 0

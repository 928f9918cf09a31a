"""``kq offsets``: a topic's offsets per partition (Kafka's
``kafka-get-offsets``).

kq offsets --topic T [--time earliest|latest|max-timestamp|MS] [--partition P]

Prints ``topic:partition:offset`` lines: the log start offset (earliest),
the high watermark (latest, the default), or the first offset whose record
timestamp is at least MS (empty offset if none is that late).
"""

from __future__ import annotations

import argparse
import json

from broker.client.producer_batch import TopicPartition
from broker.grpc_client.admin import Admin, OffsetSpec, PartitionOffset
from kq.commands.client_flags import (
    add_client_flags,
    broker_bootstrap,
    chosen_partitions,
    client_errors,
    parse_partition,
)
from kq.commands.common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_credentials,
    command,
    run_async,
)

__all__ = ["register"]

NAMED = {
    "earliest": OffsetSpec.EARLIEST,
    "latest": OffsetSpec.LATEST,
    "max-timestamp": OffsetSpec.MAX_TIMESTAMP,
    "-1": OffsetSpec.LATEST,
    "-2": OffsetSpec.EARLIEST,
    "-3": OffsetSpec.MAX_TIMESTAMP,
}


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "offsets",
        help="print a topic's offsets per partition (earliest, latest or by time)",
        description=(
            "Print topic:partition:offset for each partition of --topic (as "
            "kafka-get-offsets): earliest (the log start), latest (the high watermark, "
            "the default), max-timestamp, or the first offset at or after a time in ms."
        ),
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--time", default="latest", help="earliest, latest (default), max-timestamp or MS"
    )
    parser.add_argument("--partition", type=parse_partition, help="only this partition")
    parser.add_argument(
        "--timeout-ms", type=int, default=10_000, help="give up after this long (default 10000)"
    )
    add_client_flags(parser)
    parser.set_defaults(func=_offsets)


def _spec(text: str) -> OffsetSpec | int:
    if text in NAMED:
        return NAMED[text]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise CommandError(
            f"--time {text!r}: earliest, latest, max-timestamp or a time in ms (>= 0)",
            EXIT_USAGE,
        )
    return value


@command("offsets")
def _offsets(args: argparse.Namespace) -> int:
    spec = _spec(args.time)
    if args.timeout_ms < 1:
        raise CommandError(f"--timeout-ms must be >= 1, not {args.timeout_ms}", EXIT_USAGE)
    addresses = broker_bootstrap(args)
    credentials = client_credentials(args)

    async def go() -> dict[TopicPartition, PartitionOffset]:
        async with Admin(addresses, credentials=credentials, timeout_ms=args.timeout_ms) as admin:
            partitions = await admin.topic(args.topic)
            chosen = chosen_partitions(args, len(partitions))
            return await admin.list_offsets({TopicPartition(args.topic, p): spec for p in chosen})

    with client_errors():
        found = run_async(go())
    rows = sorted(found.items())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "offset": None if info.offset < 0 else info.offset,
                        "timestamp": None if info.timestamp < 0 else info.timestamp,
                        "leader_epoch": info.leader_epoch,
                    }
                    for tp, info in rows
                ],
                indent=2,
            )
        )
    else:
        for tp, info in rows:
            print(f"{tp.topic}:{tp.partition}:{'' if info.offset < 0 else info.offset}")
    return EXIT_OK

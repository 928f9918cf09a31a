"""``kq consume``: print a topic's records (Kafka's ``kafka-console-consumer``).

kq consume --topic T [--from-beginning] [--partition P [--offset O|earliest|latest]]
           [--max-messages N] [--timeout-ms MS]
           [--print-key] [--print-offset] [--print-partition] [--key-separator SEP]
           [--isolation-level read_uncommitted|read_committed]
kq consume --group G (--topic T | --include REGEX) [--from-beginning] [--print-commits] ...

Every partition of the topic, or ``--partition``'s, from the end (records
produced from now on) unless ``--from-beginning`` or ``--offset``.  With
``--group`` it is a member of that consumer group instead (docs/clients.md):
it reads the partitions the group gives it, from the group's committed
offsets (``--from-beginning``: the earliest record where the group has
none, as Kafka's console consumer), commits what it printed as it goes
(auto-commit) and when it stops (Ctrl-C or SIGTERM), and leaves the group;
``--print-commits`` prints each commit the coordinator acknowledged, after
the records it covers. Each record
prints as its value, preceded by ``Partition:P``, ``Offset:O`` and its key
when asked (tab-separated as Kafka's ``DefaultMessageFormatter``); ``--json``
prints one object per line. It stops after ``--max-messages`` records, after
``--timeout-ms`` without a record, or on Ctrl-C, and says on stderr how many
records it printed. ``--isolation-level read_committed`` reads below each
partition's last stable offset and never prints a record of an aborted
transaction (Kafka's ``isolation.level``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from broker.client.consumer import (
    ConsumerConfig,
    ConsumerRecord,
    IsolationLevel,
    OffsetResetStrategy,
)
from broker.client.producer_batch import TopicPartition
from broker.grpc_client.admin import Admin
from broker.grpc_client.consumer import Consumer
from broker.grpc_client.group import OffsetAndEpoch
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
    json_bytes,
    run_async,
)

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "consume",
        help="print a topic's records",
        description=(
            "Print the records of --topic (as kafka-console-consumer): all its "
            "partitions, or --partition's; from the end unless --from-beginning or --offset."
        ),
    )
    parser.add_argument("--topic", help="the topic (required unless --include)")
    parser.add_argument("--group", metavar="G", help="consume as a member of this consumer group")
    parser.add_argument(
        "--include",
        metavar="REGEX",
        help="with --group: every topic whose whole name matches (Python re)",
    )
    parser.add_argument(
        "--print-commits",
        action="store_true",
        help="with --group: print each partition's commit once the coordinator acknowledged "
        "it, as Committed<TAB>Topic:T<TAB>Partition:P<TAB>Offset:O (the next offset to read; "
        'with --json {"committed": {"topic", "partition", "offset", "leader_epoch"}})',
    )
    parser.add_argument(
        "--from-beginning",
        action="store_true",
        help="start from the earliest record instead of the end",
    )
    parser.add_argument("--partition", type=parse_partition, help="only this partition")
    parser.add_argument(
        "--offset",
        help="with --partition: the offset to start at, or earliest or latest",
    )
    parser.add_argument(
        "--max-messages", type=int, help="stop after this many records (default: no limit)"
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        help="stop after this long without a record (default: wait for ever)",
    )
    parser.add_argument("--print-key", action="store_true", help="print each record's key")
    parser.add_argument("--print-offset", action="store_true", help="print each record's offset")
    parser.add_argument(
        "--print-partition", action="store_true", help="print each record's partition"
    )
    parser.add_argument(
        "--key-separator",
        default="\t",
        metavar="SEP",
        help="between the key and the value with --print-key (default: a tab)",
    )
    parser.add_argument(
        "--isolation-level",
        choices=[level.value for level in IsolationLevel],
        default=IsolationLevel.READ_UNCOMMITTED.value,
        help="read_uncommitted (default: every record below the high watermark) or "
        "read_committed (below the last stable offset, no record of an aborted transaction)",
    )
    add_client_flags(parser)
    parser.set_defaults(func=_consume)


def _start(args: argparse.Namespace) -> int | str | None:
    """Where to start: an offset, "earliest", "latest", or None (the end)."""
    if args.offset is None:
        return "earliest" if args.from_beginning else None
    if args.partition is None:
        raise CommandError("--offset needs --partition", EXIT_USAGE)
    if args.from_beginning:
        raise CommandError("--from-beginning and --offset cannot be given together", EXIT_USAGE)
    if args.offset in ("earliest", "latest"):
        return str(args.offset)
    try:
        offset = int(args.offset)
    except ValueError:
        raise CommandError(
            f"--offset {args.offset!r}: an offset, earliest or latest", EXIT_USAGE
        ) from None
    if offset < 0:
        raise CommandError(f"--offset must be >= 0, not {offset}", EXIT_USAGE)
    return offset


def _check_group_flags(args: argparse.Namespace) -> None:
    if args.group is None:
        if args.include is not None:
            raise CommandError("--include needs --group", EXIT_USAGE)
        if args.print_commits:
            raise CommandError(
                "--print-commits needs --group (only a group's member commits)", EXIT_USAGE
            )
        if args.topic is None:
            raise CommandError("--topic is required", EXIT_USAGE)
        return
    if not args.group:
        raise CommandError("--group must not be empty", EXIT_USAGE)
    if (args.topic is None) == (args.include is None):
        raise CommandError("--group needs exactly one of --topic and --include", EXIT_USAGE)
    for flag, value in (("--partition", args.partition), ("--offset", args.offset)):
        if value is not None:
            raise CommandError(
                f"{flag} cannot be given with --group (the group assigns partitions and "
                "its committed offsets say where to start)",
                EXIT_USAGE,
            )


@command("consume")
def _consume(args: argparse.Namespace) -> int:
    _check_group_flags(args)
    start = _start(args)
    if args.max_messages is not None and args.max_messages < 1:
        raise CommandError(f"--max-messages must be >= 1, not {args.max_messages}", EXIT_USAGE)
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise CommandError(f"--timeout-ms must be >= 0, not {args.timeout_ms}", EXIT_USAGE)
    addresses = broker_bootstrap(args)
    credentials = client_credentials(args)
    printed = [0]
    try:
        with client_errors():
            run_async(_run(args, addresses, credentials, start, printed))
    except KeyboardInterrupt:
        pass
    print(f"Processed a total of {printed[0]} messages", file=sys.stderr)
    return EXIT_OK


async def _run(
    args: argparse.Namespace,
    addresses: list[str],
    credentials: Any,
    start: int | str | None,
    printed: list[int],
) -> None:
    if args.group is not None:
        await _run_group(args, addresses, credentials, printed)
        return
    async with Admin(addresses, credentials=credentials, timeout_ms=10_000) as admin:
        partitions = await admin.topic(args.topic)
    chosen = chosen_partitions(args, len(partitions))
    reset = OffsetResetStrategy.EARLIEST if start == "earliest" else OffsetResetStrategy.LATEST
    config = ConsumerConfig(
        auto_offset_reset=reset, isolation_level=IsolationLevel(args.isolation_level)
    )
    async with Consumer(addresses, config, credentials=credentials) as consumer:
        consumer.assign([(args.topic, p) for p in chosen])
        if isinstance(start, int):
            consumer.seek((args.topic, chosen[0]), start)
        elif start == "earliest":
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_end()
        await _print_polls(args, consumer, printed)


async def _run_group(
    args: argparse.Namespace, addresses: list[str], credentials: Any, printed: list[int]
) -> None:
    reset = OffsetResetStrategy.EARLIEST if args.from_beginning else OffsetResetStrategy.LATEST
    consumer = Consumer(
        addresses,
        ConsumerConfig(
            auto_offset_reset=reset, isolation_level=IsolationLevel(args.isolation_level)
        ),
        credentials=credentials,
        group_id=args.group,
        client_id="kq-console-consumer",
        on_commit=(lambda offsets: _print_commits(args, offsets)) if args.print_commits else None,
    )
    # SIGTERM stops it as Ctrl-C does, so that it still commits and leaves
    # (Kafka's console consumer closes its consumer in a shutdown hook).
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = []

    def on_sigterm() -> None:
        terminated.append(True)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        if args.include is not None:
            consumer.subscribe(pattern=args.include)
        else:
            consumer.subscribe([args.topic])
        await _print_polls(args, consumer, printed)
    except asyncio.CancelledError:
        if not terminated:
            raise
        task.uncancel()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        # Commits what was printed and leaves the group (a Ctrl-C too).
        await consumer.close()


async def _print_polls(args: argparse.Namespace, consumer: Consumer, printed: list[int]) -> None:
    loop = asyncio.get_running_loop()
    idle_since = loop.time()
    while args.max_messages is None or printed[0] < args.max_messages:
        wait = 1_000
        if args.timeout_ms is not None:
            left = args.timeout_ms - (loop.time() - idle_since) * 1000
            if left <= 0:
                return
            wait = int(min(wait, left)) or 1
        left_to_print = None if args.max_messages is None else args.max_messages - printed[0]
        records = await consumer.poll(wait, left_to_print)
        if records:
            idle_since = loop.time()
        for record in records:
            _print(args, record)
            printed[0] += 1
        sys.stdout.flush()


def _print_commits(args: argparse.Namespace, offsets: dict[TopicPartition, OffsetAndEpoch]) -> None:
    """The partitions a commit stored, once the coordinator acknowledged them
    (records printed before are below each offset)."""
    for tp, (offset, leader_epoch) in sorted(offsets.items()):
        if args.json:
            committed = {
                "topic": tp.topic,
                "partition": tp.partition,
                "offset": offset,
                "leader_epoch": leader_epoch,
            }
            print(json.dumps({"committed": committed}))
        else:
            print(f"Committed\tTopic:{tp.topic}\tPartition:{tp.partition}\tOffset:{offset}")
    sys.stdout.flush()


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", "backslashreplace")


def _print(args: argparse.Namespace, record: ConsumerRecord) -> None:
    if args.json:
        obj: dict[str, Any] = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            **json_bytes("key", record.key),
            **json_bytes("value", record.value),
        }
        if record.headers:
            obj["headers"] = {k: _text(v) for k, v in record.headers}
        print(json.dumps(obj))
        return
    fields = []
    if args.print_partition:
        fields.append(f"Partition:{record.partition}")
    if args.print_offset:
        fields.append(f"Offset:{record.offset}")
    line = "\t".join(fields) + ("\t" if fields else "")
    if args.print_key:
        line += _text(record.key) + args.key_separator
    print(line + _text(record.value))

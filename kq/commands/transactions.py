"""``kq transactions``: list, describe, find hanging and abort transactions
(Kafka's ``kafka-transactions.sh``, KIP-664; its subcommands are actions
given as flags here, as ``kq groups`` gives them).

kq transactions --list [--state S ...] [--producer-id N ...] [--duration-filter MS]
kq transactions --describe --transactional-id ID
kq transactions --describe-producers --topic T --partition P
kq transactions --find-hanging (--broker-id N | --topic T [--partition P])
                [--max-transaction-timeout MS]
kq transactions --abort --topic T --partition P
                (--start-offset O | --producer-id N --producer-epoch E --coordinator-epoch C)

The tables are Kafka's columns (docs/operations.md says what each means);
``--json`` prints the same as JSON, with null where the table says None.
Exit statuses are those of every kq command (kq.commands.common): 0 done,
1 refused or not found (nothing changed), 2 bad flags, 3 an abort whose
marker may or may not have been written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from broker.client.hanging import (
    ACTIVE_STATES,
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    TRANSACTION_STATES,
    HangingTransaction,
)
from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.txn_admin import (
    AbortSpec,
    ProducerState,
    TransactionAdmin,
    TransactionDescription,
    TransactionListing,
    wall_clock_ms,
)
from kq.commands.client_flags import (
    add_client_flags,
    broker_bootstrap,
    client_errors,
    parse_partition,
)
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_INDETERMINATE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    client_credentials,
    command,
    format_table,
    run_async,
)

__all__ = ["parse_states", "register"]

ACTIONS = ("list", "describe", "describe_producers", "find_hanging", "abort")

# The flags each action takes (by their argparse dest); any other given is
# refused, naming it.
TAKES: dict[str, frozenset[str]] = {
    "list": frozenset({"state", "producer_id", "duration_filter"}),
    "describe": frozenset({"transactional_id"}),
    "describe_producers": frozenset({"topic", "partition"}),
    "find_hanging": frozenset({"topic", "partition", "broker_id", "max_transaction_timeout"}),
    "abort": frozenset(
        {"topic", "partition", "start_offset", "producer_id", "producer_epoch", "coordinator_epoch"}
    ),
}
OPTIONS = (
    "transactional_id",
    "topic",
    "partition",
    "broker_id",
    "max_transaction_timeout",
    "start_offset",
    "producer_id",
    "producer_epoch",
    "coordinator_epoch",
    "state",
    "duration_filter",
)
# The largest producer epoch (Kafka's Short.MAX_VALUE).
MAX_EPOCH = 32_767


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _non_negative(what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{what} is >= 0, not {value}")
        return value

    return parse


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "transactions",
        help="list, describe, find hanging and abort transactions",
        description=(
            "Transactions, as kafka-transactions.sh: --list every coordinator's "
            "transactions, --describe a transactional id at its coordinator, "
            "--describe-producers of a partition (its leader's producers and their open "
            "transactions), --find-hanging transactions (open in a partition, ended or "
            "unknown at their coordinator) and --abort one (an ABORT marker written to the "
            "partition; needs ClusterAction)."
        ),
    )
    actions = parser.add_argument_group("actions (one of)")
    actions.add_argument("--list", action="store_true", help="list every broker's transactions")
    actions.add_argument("--describe", action="store_true", help="describe --transactional-id")
    actions.add_argument(
        "--describe-producers",
        action="store_true",
        help="the producers of --topic --partition, at its leader",
    )
    actions.add_argument(
        "--find-hanging",
        action="store_true",
        help="open transactions no coordinator will end, in --topic's partitions or those "
        "--broker-id leads",
    )
    actions.add_argument(
        "--abort",
        action="store_true",
        help="abort the open transaction of --topic --partition starting at --start-offset "
        "(or of --producer-id at --producer-epoch and --coordinator-epoch)",
    )
    parser.add_argument("--transactional-id", metavar="ID", help="with --describe")
    parser.add_argument("--topic", metavar="T", help="a topic")
    parser.add_argument("--partition", type=parse_partition, metavar="P", help="a partition")
    parser.add_argument(
        "--broker-id",
        type=_non_negative("a broker id"),
        metavar="N",
        help="with --find-hanging: every partition this broker leads",
    )
    parser.add_argument(
        "--max-transaction-timeout",
        type=_non_negative("a time in ms"),
        metavar="MS",
        help="with --find-hanging: an open transaction whose producer last wrote longer ago "
        "is checked with its coordinator (default: transaction.max.timeout.ms's "
        f"{DEFAULT_MAX_TRANSACTION_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--start-offset",
        type=_non_negative("an offset"),
        metavar="O",
        help="with --abort: the first offset of the transaction to abort",
    )
    parser.add_argument(
        "--producer-id",
        type=_non_negative("a producer id"),
        action="append",
        default=[],
        metavar="N",
        help="with --list: only this producer's (repeatable); with --abort: the producer",
    )
    parser.add_argument(
        "--producer-epoch",
        type=_non_negative("a producer epoch"),
        metavar="E",
        help="with --abort --producer-id: the producer's epoch",
    )
    parser.add_argument(
        "--coordinator-epoch",
        type=_non_negative("a coordinator epoch"),
        metavar="C",
        help="with --abort --producer-id: the coordinator epoch of the marker",
    )
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="S[,S...]",
        help="with --list: only transactions in these states (repeatable; "
        + ", ".join(TRANSACTION_STATES)
        + ")",
    )
    parser.add_argument(
        "--duration-filter",
        type=_non_negative("a time in ms"),
        metavar="MS",
        help="with --list: only transactions open for longer than this (KIP-994)",
    )
    parser.add_argument(
        "--timeout-ms", type=int, default=30_000, help="give up after this long (default 30000)"
    )
    add_client_flags(parser)
    parser.set_defaults(func=_transactions)


# -- parsing ----------------------------------------------------------------------


def parse_states(values: list[str]) -> list[str]:
    """``--state`` values (each may list several, comma-separated) as
    Kafka's state names, matched without regard to case."""
    by_lower = {s.lower(): s for s in TRANSACTION_STATES}
    out: list[str] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            state = by_lower.get(name.lower())
            if state is None:
                raise CommandError(
                    f"--state {name!r} is not a transaction state (one of "
                    f"{', '.join(TRANSACTION_STATES)})",
                    EXIT_USAGE,
                )
            out.append(state)
    return list(dict.fromkeys(out))


def _given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest) not in (None, [])


def _validate(args: argparse.Namespace) -> str:
    """The action; every flag that does not fit it is refused, naming it."""
    chosen = [a for a in ACTIONS if getattr(args, a)]
    names = " ".join(_flag(a) for a in ACTIONS)
    if not chosen:
        raise CommandError(f"give one action of {names}", EXIT_USAGE)
    if len(chosen) > 1:
        raise CommandError(
            f"{' and '.join(_flag(a) for a in chosen)} are exclusive: give one action of {names}",
            EXIT_USAGE,
        )
    action = chosen[0]
    if args.timeout_ms < 1:
        raise CommandError(f"--timeout-ms must be >= 1, not {args.timeout_ms}", EXIT_USAGE)
    stray = [_flag(o) for o in OPTIONS if _given(args, o) and o not in TAKES[action]]
    if stray:
        raise CommandError(
            f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not go with {_flag(action)}",
            EXIT_USAGE,
        )
    if action == "describe" and not args.transactional_id:
        raise CommandError("--describe needs --transactional-id", EXIT_USAGE)
    if action in ("describe_producers", "abort"):
        missing = [_flag(o) for o in ("topic", "partition") if not _given(args, o)]
        if missing:
            raise CommandError(f"{_flag(action)} needs {' and '.join(missing)}", EXIT_USAGE)
    if action == "find_hanging":
        if _given(args, "broker_id") == _given(args, "topic"):
            raise CommandError(
                "--find-hanging needs --broker-id N or --topic T [--partition P], one of them",
                EXIT_USAGE,
            )
        if _given(args, "partition") and not _given(args, "topic"):
            raise CommandError("--partition goes with --topic", EXIT_USAGE)
    if args.topic == "":
        raise CommandError("--topic is empty", EXIT_USAGE)
    if action == "abort":
        explicit = ("producer_id", "producer_epoch", "coordinator_epoch")
        named = [o for o in explicit if _given(args, o)]
        if _given(args, "start_offset"):
            if named:
                raise CommandError(
                    f"--start-offset and {', '.join(_flag(o) for o in named)}: give "
                    "--start-offset O, or --producer-id N --producer-epoch E "
                    "--coordinator-epoch C",
                    EXIT_USAGE,
                )
        elif len(named) < len(explicit):
            if not named:
                raise CommandError(
                    "--abort needs --start-offset O, or --producer-id N --producer-epoch E "
                    "--coordinator-epoch C",
                    EXIT_USAGE,
                )
            missing = [_flag(o) for o in explicit if o not in named]
            raise CommandError(
                f"--abort --producer-id needs {' and '.join(missing)} too", EXIT_USAGE
            )
        if len(args.producer_id) > 1:
            raise CommandError(
                f"--abort takes one --producer-id, not {len(args.producer_id)}", EXIT_USAGE
            )
        if args.producer_epoch is not None and args.producer_epoch > MAX_EPOCH:
            raise CommandError(
                f"--producer-epoch must be at most {MAX_EPOCH}, not {args.producer_epoch}",
                EXIT_USAGE,
            )
    return action


# -- running ----------------------------------------------------------------------


@command("transactions")
def _transactions(args: argparse.Namespace) -> int:
    action = _validate(args)
    states = parse_states(args.state)
    addresses = broker_bootstrap(args)
    credentials = client_credentials(args)

    def admin() -> TransactionAdmin:
        return TransactionAdmin(addresses, credentials=credentials, timeout_ms=args.timeout_ms)

    if action == "list":
        return _list(args, admin, states)
    if action == "describe":
        return _describe(args, admin)
    if action == "describe_producers":
        return _describe_producers(args, admin)
    if action == "find_hanging":
        return _find_hanging(args, admin)
    return _abort(args, admin)


def _none(value: int) -> object:
    """-1 (Kafka's empty Optional) as JSON's null."""
    return None if value < 0 else value


def _table_none(value: int) -> object:
    """-1 as Kafka's tables print an empty Optional."""
    return "None" if value < 0 else value


def _list(
    args: argparse.Namespace, admin: Callable[[], TransactionAdmin], states: list[str]
) -> int:
    async def go() -> list[TransactionListing]:
        async with admin() as txns:
            return await txns.list_transactions(
                states,
                args.producer_id,
                -1 if args.duration_filter is None else args.duration_filter,
            )

    with client_errors():
        found = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "transactional_id": t.transactional_id,
                        "coordinator": t.coordinator_id,
                        "producer_id": t.producer_id,
                        "state": t.state,
                    }
                    for t in found
                ],
                indent=2,
            )
        )
    else:
        print(
            format_table(
                ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                [[t.transactional_id, t.coordinator_id, t.producer_id, t.state] for t in found],
            )
        )
    return EXIT_OK


def _describe(args: argparse.Namespace, admin: Callable[[], TransactionAdmin]) -> int:
    async def go() -> TransactionDescription:
        async with admin() as txns:
            return await txns.describe_transaction(args.transactional_id)

    with client_errors():
        found = run_async(go())
    start = found.transaction_start_time_ms
    # The coordinator keeps the last transaction's start time after it
    # ended (as Kafka's does): a duration only while one is open.
    is_open = start >= 0 and found.state in ACTIVE_STATES
    duration = max(0, wall_clock_ms() - start) if is_open else -1
    if args.json:
        print(
            json.dumps(
                {
                    "coordinator_id": found.coordinator_id,
                    "transactional_id": found.transactional_id,
                    "producer_id": found.producer_id,
                    "producer_epoch": found.producer_epoch,
                    "state": found.state,
                    "transaction_timeout_ms": found.transaction_timeout_ms,
                    "current_transaction_start_time_ms": _none(start),
                    "transaction_duration_ms": _none(duration),
                    "topic_partitions": [
                        {"topic": tp.topic, "partition": tp.partition} for tp in found.partitions
                    ],
                },
                indent=2,
            )
        )
        return EXIT_OK
    headers = [
        "CoordinatorId",
        "TransactionalId",
        "ProducerId",
        "ProducerEpoch",
        "TransactionState",
        "TransactionTimeoutMs",
        "CurrentTransactionStartTimeMs",
        "TransactionDurationMs",
        "TopicPartitions",
    ]
    row = [
        found.coordinator_id,
        found.transactional_id,
        found.producer_id,
        found.producer_epoch,
        found.state,
        found.transaction_timeout_ms,
        _table_none(start),
        _table_none(duration),
        ",".join(str(tp) for tp in found.partitions),
    ]
    print(format_table(headers, [row]))
    return EXIT_OK


def _producer_json(state: ProducerState) -> dict[str, Any]:
    return {
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "latest_coordinator_epoch": _none(state.coordinator_epoch),
        "last_sequence": state.last_sequence,
        "last_timestamp": state.last_timestamp,
        "current_transaction_start_offset": _none(state.current_txn_start_offset),
    }


def _describe_producers(args: argparse.Namespace, admin: Callable[[], TransactionAdmin]) -> int:
    tp = TopicPartition(args.topic, args.partition)

    async def go() -> list[ProducerState]:
        async with admin() as txns:
            return (await txns.describe_producers([tp]))[tp]

    with client_errors():
        found = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {"topic": tp.topic, "partition": tp.partition, **_producer_json(state)}
                    for state in found
                ],
                indent=2,
            )
        )
        return EXIT_OK
    headers = [
        "ProducerId",
        "ProducerEpoch",
        "LatestCoordinatorEpoch",
        "LastSequence",
        "LastTimestamp",
        "CurrentTransactionStartOffset",
    ]
    rows = [
        [
            s.producer_id,
            s.producer_epoch,
            _table_none(s.coordinator_epoch),
            s.last_sequence,
            s.last_timestamp,
            _table_none(s.current_txn_start_offset),
        ]
        for s in found
    ]
    print(format_table(headers, rows))
    return EXIT_OK


def _find_hanging(args: argparse.Namespace, admin: Callable[[], TransactionAdmin]) -> int:
    timeout = (
        DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
        if args.max_transaction_timeout is None
        else args.max_transaction_timeout
    )

    async def go() -> list[HangingTransaction]:
        async with admin() as txns:
            if args.broker_id is not None:
                partitions = await txns.partitions_led_by(args.broker_id)
            else:
                every = await txns.topic_partitions(args.topic)
                if args.partition is None:
                    partitions = every
                elif args.partition >= len(every):
                    raise CommandError(
                        f"topic {args.topic!r} has no partition {args.partition} (it has "
                        f"{len(every)})",
                        EXIT_FAILURE,
                    )
                else:
                    partitions = [TopicPartition(args.topic, args.partition)]
            return await txns.find_hanging(partitions, timeout)

    with client_errors():
        found = run_async(go())
    now = wall_clock_ms()
    rows = [
        {
            "topic": h.transaction.partition.topic,
            "partition": h.transaction.partition.partition,
            "producer_id": h.transaction.producer.producer_id,
            "producer_epoch": h.transaction.producer.producer_epoch,
            "coordinator_epoch": h.transaction.producer.coordinator_epoch,
            "start_offset": h.transaction.start_offset,
            "last_timestamp": h.transaction.producer.last_timestamp,
            "duration_min": h.transaction.duration_ms(now) // 60_000,
            "reason": h.reason,
        }
        for h in found
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("No hanging transactions found")
        return EXIT_OK
    headers = [
        "Topic",
        "Partition",
        "ProducerId",
        "ProducerEpoch",
        "CoordinatorEpoch",
        "StartOffset",
        "LastTimestamp",
        "Duration(min)",
    ]
    keys = [
        "topic",
        "partition",
        "producer_id",
        "producer_epoch",
        "coordinator_epoch",
        "start_offset",
        "last_timestamp",
        "duration_min",
    ]
    print(format_table(headers, [[r[k] for k in keys] for r in rows]))
    return EXIT_OK


def _abort(args: argparse.Namespace, admin: Callable[[], TransactionAdmin]) -> int:
    tp = TopicPartition(args.topic, args.partition)

    async def go() -> AbortSpec:
        async with admin() as txns:
            if args.start_offset is not None:
                spec = await txns.find_open_transaction(tp, args.start_offset)
            else:
                spec = AbortSpec(
                    tp, args.producer_id[0], args.producer_epoch, args.coordinator_epoch
                )
            try:
                await txns.abort_transaction(spec)
            except BrokerClientError as exc:
                if exc.code == Errors.REQUEST_TIMED_OUT:
                    raise CommandError(
                        f"the ABORT marker may or may not have been written: {exc} "
                        "(--describe-producers to find out)",
                        EXIT_INDETERMINATE,
                    ) from None
                raise
            return spec

    with client_errors():
        spec = run_async(go())
    if args.json:
        print(
            json.dumps(
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "producer_id": spec.producer_id,
                    "producer_epoch": spec.producer_epoch,
                    "coordinator_epoch": spec.coordinator_epoch,
                    "start_offset": args.start_offset,
                },
                indent=2,
            )
        )
    else:
        print(
            f"Wrote the ABORT marker of producer {spec.producer_id} (epoch "
            f"{spec.producer_epoch}, coordinator epoch {spec.coordinator_epoch}) to {tp}"
        )
    return EXIT_OK

"""``kq produce``: records from stdin to a topic, one per line (Kafka's
``kafka-console-producer``).

kq produce --topic T [--acks all|1|0] [--key-separator SEP] [--partition P]
           [--sync] [--compression none|gzip|lz4|zstd]
           [--transactional-id ID [--transaction-size N]]

Each line is a record's value, or with ``--key-separator`` its key, the
separator and its value. Records are batched (``linger.ms``) unless
``--sync``, which waits for each record's acknowledgement and prints its
partition and offset. With acks=all the producer is idempotent.

With ``--transactional-id`` the lines go in transactions of
``--transaction-size`` records (and the rest at the end of input), each
committed whole or not at all: a ``read_committed`` consumer sees all of a
transaction's records or none. A transaction one of whose records failed
is aborted (its records count as failed: no ``read_committed`` reader will
see them); a commit whose answer was lost counts its records unknown.
Another producer started with the same id fences this one, which stops.

Exit statuses: 0 every record acknowledged; 1 some failed definitely (not in
the log) or a line was refused; 2 bad usage; 3 some record's outcome is
unknown (it may be in the log).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from broker.client.errors import Outcome
from broker.client.producer_batch import Acks, ProducerConfig
from broker.grpc_client.errors import (
    BrokerClientError,
    DeliveryFailedError,
    TransactionAbortableError,
    TransactionFatalError,
)
from broker.grpc_client.producer import RecordMetadata
from broker.grpc_client.sync import SyncProducer
from kq.commands.client_flags import (
    add_client_flags,
    broker_bootstrap,
    chosen_partitions,
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
)
from partition_log.batch import Compression

__all__ = ["register"]

ACKS = {"all": Acks.ALL, "-1": Acks.ALL, "1": Acks.LEADER, "0": Acks.NONE}
COMPRESSION = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "lz4": Compression.LZ4,
    "snappy": Compression.SNAPPY,
    "zstd": Compression.ZSTD,
}
# How often a commit that timed out is asked again before its records are
# reported unknown.
COMMIT_ATTEMPTS = 3
# How long the topic may take to appear in the brokers' metadata (a topic
# just created) before the command says it does not exist.
TOPIC_WAIT_MS = 3_000


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="send records from stdin to a topic, one per line",
        description=(
            "Send one record per stdin line to --topic (as kafka-console-producer). "
            "Exit status: 0 all acknowledged, 1 some failed (definitely not written) or "
            "a line was refused, 2 usage, 3 some outcome unknown (may be in the log)."
        ),
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--acks",
        choices=sorted(ACKS),
        default="all",
        help="all (default; idempotent), 1 (the leader's append) or 0 (no answer)",
    )
    parser.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line into key SEP value (default: no key)",
    )
    parser.add_argument(
        "--partition", type=parse_partition, help="send every record to this partition"
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="wait for each record's acknowledgement and print its partition and offset",
    )
    parser.add_argument("--compression", choices=sorted(COMPRESSION), default="none")
    parser.add_argument(
        "--linger-ms", type=int, default=5, help="how long a batch waits to fill (default 5)"
    )
    parser.add_argument(
        "--delivery-timeout-ms",
        type=int,
        default=120_000,
        help="how long a record may take to be acknowledged, retries included (default 120000)",
    )
    parser.add_argument(
        "--transactional-id",
        metavar="ID",
        help="send the lines in transactions under this transactional id (acks all)",
    )
    parser.add_argument(
        "--transaction-size",
        type=int,
        default=1000,
        metavar="N",
        help="records per transaction with --transactional-id (default 1000)",
    )
    add_client_flags(parser)
    parser.set_defaults(func=_produce)


@dataclass
class _Tally:
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0  # definitely not in the log, or refused before sending
    unknown: int = 0  # may be in the log
    errors: list[dict[str, Any]] = field(default_factory=list)
    # --transactional-id: transactions committed and aborted.
    committed: int = 0
    aborted: int = 0


def _lines(stream: BinaryIO) -> Any:
    for number, raw in enumerate(stream, start=1):
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        yield number, line


def _split(line: bytes, separator: bytes | None, number: int) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, found, value = line.partition(separator)
    if not found:
        raise ValueError(f"line {number} has no key separator {separator.decode()!r}")
    return key, value


@command("produce")
def _produce(args: argparse.Namespace) -> int:
    if args.key_separator == "":
        raise CommandError("--key-separator must not be empty", EXIT_USAGE)
    if args.linger_ms < 0:
        raise CommandError(f"--linger-ms must be >= 0, not {args.linger_ms}", EXIT_USAGE)
    if args.transactional_id is not None:
        if not args.transactional_id:
            raise CommandError("--transactional-id must not be empty", EXIT_USAGE)
        if args.acks not in ("all", "-1"):
            raise CommandError(f"--transactional-id needs --acks all, not {args.acks}", EXIT_USAGE)
        if args.transaction_size < 1:
            raise CommandError(
                f"--transaction-size must be >= 1, not {args.transaction_size}", EXIT_USAGE
            )
    acks = ACKS[args.acks]
    try:
        config = ProducerConfig(
            acks=acks,
            enable_idempotence=acks is Acks.ALL,
            linger_ms=0 if args.sync else args.linger_ms,
            compression_type=COMPRESSION[args.compression],
            delivery_timeout_ms=args.delivery_timeout_ms,
            request_timeout_ms=min(30_000, args.delivery_timeout_ms),
        )
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    addresses = broker_bootstrap(args)
    credentials = client_credentials(args)
    separator = None if args.key_separator is None else args.key_separator.encode()
    tally = _Tally()
    with client_errors():
        producer = SyncProducer(
            addresses,
            config,
            credentials=credentials,
            transactional_id=args.transactional_id,
        )
        try:
            chosen_partitions(args, producer.partitions_for(args.topic, TOPIC_WAIT_MS), EXIT_USAGE)
            if args.transactional_id is None:
                _send_all(args, producer, separator, tally)
            else:
                _send_transactions(args, producer, separator, tally)
            producer.flush()
        finally:
            producer.close()
    _summary(args, tally)
    if tally.unknown:
        return EXIT_INDETERMINATE
    return EXIT_FAILURE if tally.failed else EXIT_OK


def _send_all(
    args: argparse.Namespace, producer: SyncProducer, separator: bytes | None, tally: _Tally
) -> None:
    pending: list[tuple[int, concurrent.futures.Future[RecordMetadata]]] = []
    try:
        _read(args, producer, separator, tally, pending)
    except KeyboardInterrupt:
        # Ctrl-C: what was read is still sent and reported.
        print("kq produce: interrupted; sending what was read", file=sys.stderr)
    producer.flush()
    for number, future in pending:
        _settle(args, tally, number, future)


def _send_transactions(
    args: argparse.Namespace, producer: SyncProducer, separator: bytes | None, tally: _Tally
) -> None:
    """The lines in transactions of ``--transaction-size`` records."""
    producer.init_transactions()
    lines = _lines(sys.stdin.buffer)
    while True:
        pending: list[tuple[int, concurrent.futures.Future[RecordMetadata]]] = []
        producer.begin_transaction()
        for number, line in lines:
            try:
                key, value = _split(line, separator, number)
            except ValueError as exc:
                _failed(args, tally, number, "INVALID_RECORD", str(exc), Outcome.FAIL)
                continue
            pending.append(
                (number, producer.send(args.topic, value, key=key, partition=args.partition))
            )
            tally.sent += 1
            if len(pending) >= args.transaction_size:
                break
        if not pending:
            producer.abort_transaction()
            return
        if not _end_transaction(args, producer, tally, pending):
            return


def _end_transaction(
    args: argparse.Namespace,
    producer: SyncProducer,
    tally: _Tally,
    pending: list[tuple[int, concurrent.futures.Future[RecordMetadata]]],
) -> bool:
    """Commit the transaction of ``pending`` (abort it if a record failed);
    whether the producer may go on."""
    first, last = pending[0][0], pending[-1][0]
    try:
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                producer.commit_transaction()
                break
            except (TransactionAbortableError, TransactionFatalError):
                raise
            except BrokerClientError:
                # Timed out with the state unchanged: asking again goes on
                # (an EndTxn again at the same epoch is a retry).
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
    except TransactionAbortableError as exc:
        producer.abort_transaction()
        for number, _ in pending:
            _failed(args, tally, number, exc.name, exc.message, Outcome.FAIL)
        tally.aborted += 1
        return True
    except TransactionFatalError as exc:
        # Fenced: the coordinator aborts what this producer had open.
        for number, _ in pending:
            _failed(args, tally, number, exc.name, exc.message, Outcome.FAIL)
        return False
    except BrokerClientError as exc:
        # No answer: the commit may have happened.
        for number, _ in pending:
            _failed(args, tally, number, exc.name, exc.message, Outcome.INFO)
        return False
    for number, future in pending:
        _settle(args, tally, number, future)
    tally.committed += 1
    if args.json:
        _json_line({"transaction": "committed", "first_line": first, "last_line": last})
    return True


def _read(
    args: argparse.Namespace,
    producer: SyncProducer,
    separator: bytes | None,
    tally: _Tally,
    pending: list[tuple[int, concurrent.futures.Future[RecordMetadata]]],
) -> None:
    for number, line in _lines(sys.stdin.buffer):
        try:
            key, value = _split(line, separator, number)
        except ValueError as exc:
            _failed(args, tally, number, "INVALID_RECORD", str(exc), Outcome.FAIL)
            continue
        try:
            future = producer.send(args.topic, value, key=key, partition=args.partition)
        except BrokerClientError as exc:
            _failed(args, tally, number, exc.name, exc.message, Outcome.FAIL)
            continue
        tally.sent += 1
        if args.sync:
            _settle(args, tally, number, future)
        else:
            pending.append((number, future))


def _settle(
    args: argparse.Namespace,
    tally: _Tally,
    number: int,
    future: concurrent.futures.Future[RecordMetadata],
) -> None:
    try:
        meta = future.result()
    except DeliveryFailedError as exc:
        _failed(args, tally, number, exc.name, exc.error.message, exc.outcome)
        return
    except BrokerClientError as exc:
        _failed(args, tally, number, exc.name, exc.message, Outcome.FAIL)
        return
    tally.acknowledged += 1
    if args.sync:
        if args.json:
            _json_line(
                {
                    "line": number,
                    "topic": meta.topic,
                    "partition": meta.partition,
                    "offset": meta.offset,
                }
            )
        else:
            print(f"{meta.topic}:{meta.partition}:{meta.offset}", flush=True)


def _failed(
    args: argparse.Namespace,
    tally: _Tally,
    number: int,
    name: str,
    message: str,
    outcome: Outcome,
) -> None:
    if outcome is Outcome.INFO:
        tally.unknown += 1
        what = "outcome unknown, it may be in the log"
    else:
        tally.failed += 1
        what = "not written"
    tally.errors.append(
        {"line": number, "error": name, "message": message, "outcome": outcome.value}
    )
    print(f"kq produce: line {number}: {name}: {message} ({what})", file=sys.stderr)


def _json_line(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _summary(args: argparse.Namespace, tally: _Tally) -> None:
    if args.json:
        _json_line(
            {
                "topic": args.topic,
                "records": tally.sent,
                "acknowledged": tally.acknowledged,
                "failed": tally.failed,
                "unknown": tally.unknown,
                "errors": tally.errors,
                **(
                    {"transactions": {"committed": tally.committed, "aborted": tally.aborted}}
                    if args.transactional_id is not None
                    else {}
                ),
            }
        )
    elif not args.sync or tally.failed or tally.unknown:
        unacked = f", {tally.failed} failed" if tally.failed else ""
        unknown = f", {tally.unknown} unknown" if tally.unknown else ""
        txns = (
            f" in {tally.committed} transaction(s) committed"
            + (f", {tally.aborted} aborted" if tally.aborted else "")
            if args.transactional_id is not None
            else ""
        )
        print(
            f"{tally.acknowledged} record(s) acknowledged to {args.topic}{txns}{unacked}{unknown}",
            file=sys.stdout if not (tally.failed or tally.unknown) else sys.stderr,
        )

"""``kq reassign``: move partition replicas (kafka-reassign-partitions.sh).

kq reassign start --reassignment-json-file FILE
kq reassign list
kq reassign cancel --reassignment-json-file FILE

FILE is Kafka's reassignment JSON::

    {"version": 1,
     "partitions": [{"topic": "foo", "partition": 0, "replicas": [5, 6]}]}

``start`` first prints the current assignment of those partitions, to save
for a rollback, then starts the reassignments (KIP-455: the new replicas
catch up, then the old ones leave).  ``cancel`` reverts the reassignments
in progress of the partitions in FILE (their replicas are not needed).  With
``--bootstrap``, ``--timeout`` and ``--json``; exit statuses: see
:mod:`kq.commands.admin` (1 also if any partition failed).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from kq.commands.admin import (
    MAX_ID,
    add_common_flags,
    call,
    error_name,
    fail,
    ids,
    linearizable,
    load_json_file,
)
from kq.commands.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    print_json,
)
from kqproto import metadata_pb2
from metadata.client import MetadataClient, Reassignment, error_code
from metadata.errors import Errors

__all__ = ["PlannedMove", "current_assignment", "parse_reassignment", "register"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "reassign",
        help="start, list and cancel partition reassignments",
        description=(
            "Move partition replicas between brokers, as kafka-reassign-partitions.sh, "
            'from a JSON file: {"version":1,"partitions":[{"topic":"foo","partition":0,'
            '"replicas":[5,6]}]}.'
        ),
    )

    start = commands.add_parser(
        "start",
        help="start the reassignments of a JSON file",
        description=(
            "Print the current assignment of the partitions in FILE (save it to roll "
            "back), then start moving them to the replicas FILE names."
        ),
    )
    start.add_argument("--reassignment-json-file", required=True, metavar="FILE")
    add_common_flags(start)
    start.set_defaults(func=_start)

    listing = commands.add_parser("list", help="the reassignments in progress")
    add_common_flags(listing, stale=True)
    listing.set_defaults(func=_list)

    cancel = commands.add_parser(
        "cancel",
        help="cancel the reassignments of the partitions of a JSON file",
        description=(
            "Cancel the reassignments in progress of the partitions in FILE (their "
            "replicas go back to what they were before)."
        ),
    )
    cancel.add_argument("--reassignment-json-file", required=True, metavar="FILE")
    add_common_flags(cancel)
    cancel.set_defaults(func=_cancel)


@dataclass(frozen=True, slots=True)
class PlannedMove:
    topic: str
    partition: int
    replicas: tuple[int, ...]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_reassignment(doc: Any, where: str, *, need_replicas: bool) -> list[PlannedMove]:
    """Check Kafka's reassignment JSON; a usage error names what is wrong.

    ``need_replicas`` (start): every entry needs a non-empty ``replicas``
    list; otherwise (cancel) ``replicas`` is ignored."""

    def bad(message: str) -> CommandError:
        return CommandError(f"{where}: {message}", EXIT_USAGE)

    if not isinstance(doc, dict):
        raise bad('the document must be an object like {"version":1,"partitions":[...]}')
    version = doc.get("version", 1)
    if not _is_int(version) or version != 1:
        raise bad(f"version {version!r} is not supported (only 1)")
    entries = doc.get("partitions")
    if not isinstance(entries, list):
        raise bad('"partitions" must be a list')
    if not entries:
        raise bad('"partitions" names no partition')
    moves: list[PlannedMove] = []
    seen: set[tuple[str, int]] = set()
    for i, entry in enumerate(entries):
        at = f"partitions[{i}]"
        if not isinstance(entry, dict):
            raise bad(f"{at} must be an object with topic, partition and replicas")
        topic = entry.get("topic")
        if not isinstance(topic, str) or not topic:
            raise bad(f'{at}: "topic" must be a non-empty string')
        partition = entry.get("partition")
        if not _is_int(partition) or not 0 <= partition <= MAX_ID:
            raise bad(f'{at}: "partition" must be a non-negative integer, not {partition!r}')
        if (topic, partition) in seen:
            raise bad(f"{at}: {topic}-{partition} is listed twice")
        seen.add((topic, partition))
        replicas: tuple[int, ...] = ()
        if need_replicas:
            raw = entry.get("replicas")
            if not isinstance(raw, list) or not raw:
                raise bad(f'{at}: "replicas" must be a non-empty list of broker ids')
            for r in raw:
                if not _is_int(r) or not 0 <= r <= MAX_ID:
                    raise bad(f'{at}: "replicas" holds {r!r}, which is not a broker id')
            if len(set(raw)) != len(raw):
                raise bad(f'{at}: "replicas" lists a broker twice: {raw}')
            replicas = tuple(raw)
            dirs = entry.get("log_dirs")
            if dirs is not None and (not isinstance(dirs, list) or len(dirs) != len(raw)):
                raise bad(f'{at}: "log_dirs" must list one directory per replica')
        moves.append(PlannedMove(topic, partition, replicas))
    return moves


def _load(path: str, *, need_replicas: bool) -> list[PlannedMove]:
    doc = load_json_file(path, "reassignment JSON file")
    return parse_reassignment(doc, f"reassignment JSON file {path}", need_replicas=need_replicas)


def current_assignment(
    moves: list[PlannedMove], topics: list[metadata_pb2.TopicDescription]
) -> tuple[dict[str, Any], list[str]]:
    """Kafka's rollback JSON for the partitions of ``moves`` (each one's
    replicas before any reassignment in progress), and what is missing."""
    by_name = {t.name: t for t in topics if error_code(t.error) is Errors.NONE}
    partitions: list[dict[str, Any]] = []
    missing: list[str] = []
    for move in moves:
        topic = by_name.get(move.topic)
        found = (
            next((p for p in topic.partitions if p.partition == move.partition), None)
            if topic is not None
            else None
        )
        if found is None:
            missing.append(f"{move.topic}-{move.partition}")
            continue
        adding = set(found.adding_replicas)
        original = [r for r in found.replicas if r not in adding]
        partitions.append(
            {
                "topic": move.topic,
                "partition": move.partition,
                "replicas": original,
                "log_dirs": ["any"] * len(original),
            }
        )
    return {"version": 1, "partitions": partitions}, missing


def _compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


@command("reassign start")
def _start(args: argparse.Namespace) -> int:
    moves = _load(args.reassignment_json_file, need_replicas=True)

    async def start(
        client: MetadataClient,
    ) -> tuple[dict[str, Any], metadata_pb2.AlterPartitionReassignmentsResponse]:
        described = await client.describe_topics(sorted({m.topic for m in moves}))
        current, missing = current_assignment(moves, list(described.topics))
        if missing:
            fail(
                args,
                "UNKNOWN_TOPIC_OR_PARTITION",
                f"no such partition: {', '.join(missing)}; nothing was started",
            )
        response = await client.alter_partition_reassignments(
            [Reassignment(m.topic, m.partition, m.replicas) for m in moves]
        )
        return current, response

    current, response = call(args, start)
    failures = [r for r in response.results if error_code(r.error) is not Errors.NONE]
    done = [r for r in response.results if error_code(r.error) is Errors.NONE]
    if args.json:
        print_json(
            {
                "ok": not failures,
                "current": current,
                "results": _results_json(response.results),
            }
        )
    else:
        print("Current partition replica assignment\n")
        print(_compact(current))
        print("\nSave this to use as the --reassignment-json-file option during rollback")
        if done:
            print(
                "Successfully started partition reassignments for "
                + ",".join(f"{r.topic}-{r.partition}" for r in done)
            )
    if failures:
        raise CommandError(
            "Error reassigning partition(s):\n"
            + "\n".join(
                f"{r.topic}-{r.partition}: {error_name(r.error)}: {r.message}" for r in failures
            ),
            EXIT_FAILURE,
        )
    return 0


def _results_json(results: Any) -> list[dict[str, Any]]:
    return [
        {
            "topic": r.topic,
            "partition": r.partition,
            "error": error_name(r.error),
            "message": r.message,
        }
        for r in results
    ]


@command("reassign list")
def _list(args: argparse.Namespace) -> int:
    response = call(args, lambda c: c.list_partition_reassignments(linearizable=linearizable(args)))
    ongoing = sorted(response.reassignments, key=lambda r: (r.topic, r.partition))
    if args.json:
        print_json(
            {
                "reassignments": [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "replicas": list(r.replicas),
                        "adding_replicas": list(r.adding_replicas),
                        "removing_replicas": list(r.removing_replicas),
                    }
                    for r in ongoing
                ],
                "metadata_offset": response.metadata_offset,
            }
        )
        return 0
    if not ongoing:
        print("No partition reassignments found.")
        return 0
    print("Current partition reassignments:")
    for r in ongoing:
        print(
            f"{r.topic}-{r.partition}: replicas: {ids(r.replicas)}. "
            f"adding: {ids(r.adding_replicas)}. removing: {ids(r.removing_replicas)}."
        )
    return 0


@command("reassign cancel")
def _cancel(args: argparse.Namespace) -> int:
    moves = _load(args.reassignment_json_file, need_replicas=False)
    response = call(
        args,
        lambda c: c.alter_partition_reassignments(
            [Reassignment(m.topic, m.partition, None) for m in moves]
        ),
    )
    cancelled = [r for r in response.results if error_code(r.error) is Errors.NONE]
    idle = [
        r for r in response.results if error_code(r.error) is Errors.NO_REASSIGNMENT_IN_PROGRESS
    ]
    failures = [
        r
        for r in response.results
        if error_code(r.error) not in (Errors.NONE, Errors.NO_REASSIGNMENT_IN_PROGRESS)
    ]
    if args.json:
        print_json({"ok": not failures, "results": _results_json(response.results)})
    else:
        if cancelled:
            print(
                "Successfully cancelled partition reassignments for: "
                + ",".join(f"{r.topic}-{r.partition}" for r in cancelled)
            )
        if idle:
            print(
                "No reassignment was in progress for: "
                + ",".join(f"{r.topic}-{r.partition}" for r in idle)
            )
    if failures:
        raise CommandError(
            "\n".join(
                f"Error cancelling partition reassignment for: {r.topic}-{r.partition}: "
                f"{error_name(r.error)}: {r.message}"
                for r in failures
            ),
            EXIT_FAILURE,
        )
    return 0

"""``kq groups``: list, describe, reset and delete consumer groups (Kafka's
``kafka-consumer-groups.sh``).

kq groups --list [--state [S,...]]
kq groups --describe --group G [--group G2 ...] [--offsets | --members [--verbose] | --state]
kq groups --reset-offsets --group G (--topic T[:P,P...] ... | --all-topics)
          (--to-earliest | --to-latest | --to-offset N | --to-datetime T | --shift-by N)
          (--dry-run | --execute)
kq groups --delete --group G [--group G2 ...]
kq groups --delete-offsets --group G --topic T[:P,P...] [--topic ...]

The tables are Kafka's columns (docs/operations.md says what each means);
``--json`` prints the same as JSON.  Exit statuses are those of every kq
command (kq.commands.common): 0 done, 1 refused or not found (nothing
changed), 2 bad flags, 3 a reset whose commit may or may not have happened.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from broker.client.producer_batch import TopicPartition
from broker.errors import Errors
from broker.grpc_client.errors import BrokerClientError
from broker.grpc_client.group_admin import (
    GroupAdmin,
    GroupDescription,
    GroupListing,
    GroupNotFoundError,
    PartitionLag,
    ResetKind,
    ResetSpec,
)
from kq.commands.client_flags import add_client_flags, broker_bootstrap, client_errors
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

__all__ = ["parse_datetime", "parse_topic_partitions", "register"]

ACTIONS = ("list", "describe", "reset_offsets", "delete", "delete_offsets")
STRATEGIES = ("to_earliest", "to_latest", "to_offset", "to_datetime", "shift_by")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "groups",
        help="list, describe, reset the offsets of and delete consumer groups",
        description=(
            "Consumer groups, as kafka-consumer-groups.sh: --list, --describe (offsets "
            "and lag by default, --members or --state), --reset-offsets (plan with "
            "--dry-run, commit with --execute; only for a group without members), "
            "--delete (only a group without members) and --delete-offsets."
        ),
    )
    actions = parser.add_argument_group("actions (one of)")
    actions.add_argument("--list", action="store_true", help="list every broker's groups")
    actions.add_argument("--describe", action="store_true", help="describe --group")
    actions.add_argument(
        "--reset-offsets", action="store_true", help="reset --group's committed offsets"
    )
    actions.add_argument("--delete", action="store_true", help="delete each --group")
    actions.add_argument(
        "--delete-offsets", action="store_true", help="delete --group's offsets of --topic"
    )
    parser.add_argument(
        "--group", action="append", default=[], metavar="G", help="a group id (repeatable)"
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T[:P,P...]",
        help="a topic, or some of its partitions (repeatable)",
    )
    parser.add_argument(
        "--all-topics", action="store_true", help="every topic the group has offsets for"
    )
    parser.add_argument(
        "--state",
        nargs="?",
        const="",
        default=None,
        metavar="S,...",
        help="with --list: show states, or only groups in these states (Empty, "
        "Assigning, Reconciling, Stable); with --describe: the group's state",
    )
    parser.add_argument("--members", action="store_true", help="with --describe: members")
    parser.add_argument(
        "--verbose", action="store_true", help="with --describe --members: assignments"
    )
    parser.add_argument(
        "--offsets", action="store_true", help="with --describe: offsets and lag (default)"
    )
    strategies = parser.add_argument_group("reset strategies (one of, with --reset-offsets)")
    strategies.add_argument("--to-earliest", action="store_true", help="the log start")
    strategies.add_argument("--to-latest", action="store_true", help="the high watermark")
    strategies.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    strategies.add_argument(
        "--to-datetime",
        metavar="T",
        help="the first offset at or after T (ISO 8601, e.g. 2026-01-31T12:00:00.000+00:00; "
        "no zone: local time, as Kafka)",
    )
    strategies.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (N may be < 0)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the reset plan only")
    parser.add_argument("--execute", action="store_true", help="commit the reset")
    parser.add_argument(
        "--timeout-ms", type=int, default=30_000, help="give up after this long (default 30000)"
    )
    add_client_flags(parser)
    parser.set_defaults(func=_groups)


# -- parsing ----------------------------------------------------------------------


def parse_topic_partitions(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``T`` (every partition) or ``T:P,P...``."""
    topic, sep, rest = text.partition(":")
    if not topic:
        raise CommandError(f"--topic {text!r}: the topic name is empty", EXIT_USAGE)
    if not sep:
        return topic, None
    try:
        partitions = tuple(int(p) for p in rest.split(","))
    except ValueError:
        raise CommandError(
            f"--topic {text!r}: expected T or T:P,P... with partition numbers", EXIT_USAGE
        ) from None
    if any(p < 0 for p in partitions):
        raise CommandError(f"--topic {text!r}: a partition is >= 0", EXIT_USAGE)
    return topic, tuple(sorted(set(partitions)))


def parse_datetime(text: str) -> int:
    """ISO 8601 as ms since the epoch (no zone: local time)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--to-datetime {text!r}: expected ISO 8601, e.g. 2026-01-31T12:00:00.000+00:00",
            EXIT_USAGE,
        ) from None
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise CommandError(f"--to-datetime {text!r} is before 1970", EXIT_USAGE)
    return ms


def _validate(args: argparse.Namespace) -> str:
    """The action; every flag that does not fit it is refused, naming it."""
    chosen = [a for a in ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        names = " ".join(_flag(a) for a in ACTIONS)
        if not chosen:
            raise CommandError(f"give one action of {names}", EXIT_USAGE)
        raise CommandError(
            f"{' and '.join(_flag(a) for a in chosen)} are exclusive: give one action of {names}",
            EXIT_USAGE,
        )
    action = chosen[0]
    if args.timeout_ms < 1:
        raise CommandError(f"--timeout-ms must be >= 1, not {args.timeout_ms}", EXIT_USAGE)
    groups = args.group
    if action == "list" and groups:
        raise CommandError("--list takes no --group (it lists every group)", EXIT_USAGE)
    if action != "list" and not groups:
        raise CommandError(f"{_flag(action)} needs --group", EXIT_USAGE)
    if any(not g for g in groups):
        raise CommandError("--group is empty", EXIT_USAGE)
    if action in ("reset_offsets", "delete_offsets") and len(groups) > 1:
        raise CommandError(f"{_flag(action)} takes one --group, not {len(groups)}", EXIT_USAGE)
    views = [v for v in ("offsets", "members") if getattr(args, v)]
    if args.state is not None and action == "describe":
        views.append("state")
    if action == "describe":
        if args.state:
            raise CommandError("--describe --state takes no value", EXIT_USAGE)
        if len(views) > 1:
            raise CommandError(
                f"{' and '.join(_flag(v) for v in views)} are exclusive with --describe",
                EXIT_USAGE,
            )
        if args.verbose and views != ["members"]:
            raise CommandError("--verbose goes with --describe --members", EXIT_USAGE)
    else:
        stray = [_flag(v) for v in views if v != "state"] + (["--verbose"] if args.verbose else [])
        if args.state is not None and action != "list":
            stray.append("--state")
        if stray:
            raise CommandError(
                f"{', '.join(stray)} go with --describe, not {_flag(action)}", EXIT_USAGE
            )
    strategies = [s for s in STRATEGIES if getattr(args, s) not in (None, False)]
    if action == "reset_offsets":
        if not strategies:
            raise CommandError(
                "--reset-offsets needs a strategy: --to-earliest, --to-latest, --to-offset N, "
                "--to-datetime T or --shift-by N",
                EXIT_USAGE,
            )
        if len(strategies) > 1:
            raise CommandError(
                f"{' and '.join(_flag(s) for s in strategies)}: give one reset strategy",
                EXIT_USAGE,
            )
        if args.dry_run == args.execute:
            raise CommandError(
                "--reset-offsets needs --dry-run (print the plan) or --execute (commit it), "
                "one of them",
                EXIT_USAGE,
            )
        if args.to_offset is not None and args.to_offset < 0:
            raise CommandError(f"--to-offset must be >= 0, not {args.to_offset}", EXIT_USAGE)
        if bool(args.topic) == args.all_topics:
            raise CommandError(
                "--reset-offsets needs --topic T[:P,P] ... or --all-topics, one of them",
                EXIT_USAGE,
            )
    else:
        stray = [_flag(s) for s in strategies]
        stray += [f for f, on in (("--dry-run", args.dry_run), ("--execute", args.execute)) if on]
        if args.all_topics:
            stray.append("--all-topics")
        if stray:
            raise CommandError(
                f"{', '.join(stray)} go with --reset-offsets, not {_flag(action)}", EXIT_USAGE
            )
        if action == "delete_offsets" and not args.topic:
            raise CommandError("--delete-offsets needs --topic", EXIT_USAGE)
        if action not in ("delete_offsets",) and args.topic:
            raise CommandError(f"--topic does not go with {_flag(action)}", EXIT_USAGE)
    return action


def _reset_spec(args: argparse.Namespace) -> ResetSpec:
    if args.to_earliest:
        return ResetSpec(ResetKind.EARLIEST)
    if args.to_latest:
        return ResetSpec(ResetKind.LATEST)
    if args.to_offset is not None:
        return ResetSpec(ResetKind.OFFSET, args.to_offset)
    if args.to_datetime is not None:
        return ResetSpec(ResetKind.DATETIME, parse_datetime(args.to_datetime))
    return ResetSpec(ResetKind.SHIFT_BY, args.shift_by)


# -- running ----------------------------------------------------------------------


@command("groups")
def _groups(args: argparse.Namespace) -> int:
    action = _validate(args)
    topics = [parse_topic_partitions(t) for t in args.topic]
    spec = _reset_spec(args) if action == "reset_offsets" else None
    addresses = broker_bootstrap(args)
    credentials = client_credentials(args)

    def admin() -> GroupAdmin:
        return GroupAdmin(addresses, credentials=credentials, timeout_ms=args.timeout_ms)

    if action == "list":
        return _list(args, admin)
    if action == "describe":
        return _describe(args, admin)
    if action == "reset_offsets":
        assert spec is not None
        return _reset(args, admin, topics, spec)
    if action == "delete":
        return _delete(args, admin)
    return _delete_offsets(args, admin, topics)


def _list(args: argparse.Namespace, admin: Callable[[], GroupAdmin]) -> int:
    states = [s.strip() for s in (args.state or "").split(",") if s.strip()]

    async def go() -> list[GroupListing]:
        async with admin() as groups:
            return await groups.list_groups(states)

    with client_errors():
        found = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": g.group_id,
                        "state": g.state,
                        "type": g.group_type,
                        "coordinator": g.coordinator_id,
                    }
                    for g in found
                ],
                indent=2,
            )
        )
    elif args.state is not None:
        print(format_table(["GROUP", "STATE"], [[g.group_id, g.state] for g in found]))
    else:
        for g in found:
            print(g.group_id)
    return EXIT_OK


async def _partitions_of(
    groups: GroupAdmin, topics: Sequence[tuple[str, tuple[int, ...] | None]]
) -> list[TopicPartition]:
    """``--topic`` flags as partitions; a partition the topic lacks is an
    error naming it."""
    out: list[TopicPartition] = []
    for topic, partitions in topics:
        every = await groups.topic_partitions(topic)
        if partitions is None:
            out.extend(every)
            continue
        for p in partitions:
            if p >= len(every):
                raise CommandError(
                    f"topic {topic!r} has no partition {p} (it has {len(every)})", EXIT_FAILURE
                )
            out.append(TopicPartition(topic, p))
    return sorted(set(out))


def _describe(args: argparse.Namespace, admin: Callable[[], GroupAdmin]) -> int:
    view = "members" if args.members else "state" if args.state is not None else "offsets"

    async def go() -> list[tuple[GroupDescription, dict[TopicPartition, PartitionLag]]]:
        async with admin() as groups:
            out = []
            for group_id in dict.fromkeys(args.group):
                described = await groups.describe_group(group_id)
                lag = {}
                if view == "offsets":
                    assigned = [tp for m in described.members for tp in m.assignment]
                    lag = await groups.group_lag(group_id, assigned)
                out.append((described, lag))
            return out

    with client_errors():
        found = run_async(go())
    if view == "offsets":
        _print_offsets(args, found)
    elif view == "members":
        _print_members(args, [d for d, _ in found])
    else:
        _print_state(args, [d for d, _ in found])
    return EXIT_OK


def _member_fields(group: GroupDescription, tp: TopicPartition) -> tuple[str, str, str]:
    member = group.owner(tp)
    if member is None:
        return "-", "-", "-"
    return member.member_id, f"/{member.host}" if member.host else "-", member.client_id or "-"


def _print_offsets(
    args: argparse.Namespace,
    found: list[tuple[GroupDescription, dict[TopicPartition, PartitionLag]]],
) -> None:
    rows: list[dict[str, Any]] = []
    for group, lags in found:
        for tp, lag in sorted(lags.items()):
            consumer, host, client = _member_fields(group, tp)
            rows.append(
                {
                    "group": group.group_id,
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "current_offset": lag.committed,
                    "log_end_offset": lag.log_end,
                    "lag": lag.lag,
                    "consumer_id": None if consumer == "-" else consumer,
                    "host": None if host == "-" else host.lstrip("/"),
                    "client_id": None if client == "-" else client,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for group, lags in found:
        if not lags:
            print(f"Consumer group '{group.group_id}' has no committed offsets and no members.")
        elif not group.members:
            print(f"Consumer group '{group.group_id}' has no active members.")
    headers = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    headers += ["CONSUMER-ID", "HOST", "CLIENT-ID"]
    table = [
        [
            r["group"],
            r["topic"],
            r["partition"],
            "-" if r["current_offset"] is None else r["current_offset"],
            r["log_end_offset"],
            "-" if r["lag"] is None else r["lag"],
            r["consumer_id"] or "-",
            f"/{r['host']}" if r["host"] else "-",
            r["client_id"] or "-",
        ]
        for r in rows
    ]
    if table:
        print(format_table(headers, table))


def _assignment_text(assignment: Sequence[TopicPartition]) -> str:
    """Kafka's ``t(0,1),u(2)``; ``-`` for none."""
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return "-"
    return ",".join(f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in by_topic.items())


def _print_members(args: argparse.Namespace, found: list[GroupDescription]) -> None:
    rows = [
        {
            "group": g.group_id,
            "consumer_id": m.member_id,
            "host": m.host or None,
            "client_id": m.client_id or None,
            "partitions": len(m.assignment),
            "assignment": [{"topic": tp.topic, "partition": tp.partition} for tp in m.assignment],
            "member_epoch": m.member_epoch,
            "state": m.state,
        }
        for g in found
        for m in g.members
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for g in found:
        if not g.members:
            print(f"Consumer group '{g.group_id}' has no active members.")
    headers = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    if args.verbose:
        headers.append("ASSIGNMENT")
    table = []
    for g in found:
        for m in g.members:
            row: list[object] = [
                g.group_id,
                m.member_id,
                f"/{m.host}" if m.host else "-",
                m.client_id or "-",
                len(m.assignment),
            ]
            if args.verbose:
                row.append(_assignment_text(m.assignment))
            table.append(row)
    if table:
        print(format_table(headers, table))


def _print_state(args: argparse.Namespace, found: list[GroupDescription]) -> None:
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": g.group_id,
                        "coordinator": g.coordinator,
                        "coordinator_id": g.coordinator_id,
                        "assignment_strategy": g.assignor,
                        "state": g.state,
                        "members": len(g.members),
                        "group_epoch": g.group_epoch,
                    }
                    for g in found
                ],
                indent=2,
            )
        )
        return
    headers = ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
    table = [
        [g.group_id, f"{g.coordinator} ({g.coordinator_id})", g.assignor, g.state, len(g.members)]
        for g in found
    ]
    print(format_table(headers, table))


def _reset(
    args: argparse.Namespace,
    admin: Callable[[], GroupAdmin],
    topics: Sequence[tuple[str, tuple[int, ...] | None]],
    spec: ResetSpec,
) -> int:
    group_id = args.group[0]

    async def go() -> dict[TopicPartition, int]:
        async with admin() as groups:
            try:
                described = await groups.describe_group(group_id)
            except GroupNotFoundError:
                described = None  # Kafka resets a group that does not exist yet
            if described is not None and described.members:
                # ResetOffsetsCommand: "Assignments can only be reset if the
                # group is inactive" (dry run too: the plan would be stale).
                raise CommandError(
                    f"group {group_id!r} has active members ({len(described.members)}, state "
                    f"{described.state}); stop them first",
                    EXIT_FAILURE,
                )
            if args.all_topics:
                partitions = list(await groups.list_group_offsets(group_id))
                if not partitions:
                    raise CommandError(
                        f"group {group_id!r} has no committed offsets: --all-topics resets "
                        "nothing; name --topic",
                        EXIT_FAILURE,
                    )
            else:
                partitions = await _partitions_of(groups, topics)
            plan = await groups.plan_reset(group_id, partitions, spec)
            if args.execute:
                try:
                    await groups.alter_group_offsets(group_id, plan)
                except BrokerClientError as exc:
                    if exc.code in (Errors.REQUEST_TIMED_OUT, Errors.UNKNOWN_SERVER_ERROR):
                        raise CommandError(
                            f"the reset of group {group_id!r} may or may not have been "
                            f"committed: {exc}",
                            EXIT_INDETERMINATE,
                        ) from None
                    raise
            return plan

    with client_errors():
        plan = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": group_id,
                        "topic": tp.topic,
                        "partition": tp.partition,
                        "new_offset": offset,
                    }
                    for tp, offset in sorted(plan.items())
                ],
                indent=2,
            )
        )
    else:
        print(
            format_table(
                ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                [[group_id, tp.topic, tp.partition, o] for tp, o in sorted(plan.items())],
            )
        )
    return EXIT_OK


def _delete(args: argparse.Namespace, admin: Callable[[], GroupAdmin]) -> int:
    async def go() -> dict[str, BrokerClientError | None]:
        async with admin() as groups:
            return await groups.delete_groups(args.group)

    with client_errors():
        results = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": g,
                        "deleted": error is None,
                        "error": None if error is None else error.name,
                        "message": None if error is None else error.message,
                    }
                    for g, error in results.items()
                ],
                indent=2,
            )
        )
    else:
        deleted = [g for g, e in results.items() if e is None]
        if deleted:
            print(
                "Deletion of requested consumer groups ("
                + ", ".join(f"'{g}'" for g in deleted)
                + ") was successful."
            )
        for g, e in results.items():
            if e is not None:
                print(f"Group '{g}' not deleted: {e}")
    return EXIT_OK if all(e is None for e in results.values()) else EXIT_FAILURE


def _delete_offsets(
    args: argparse.Namespace,
    admin: Callable[[], GroupAdmin],
    topics: Sequence[tuple[str, tuple[int, ...] | None]],
) -> int:
    group_id = args.group[0]

    async def go() -> list[TopicPartition]:
        async with admin() as groups:
            partitions = await _partitions_of(groups, topics)
            await groups.delete_group_offsets(group_id, partitions)
            return partitions

    with client_errors():
        partitions = run_async(go())
    if args.json:
        print(
            json.dumps(
                [
                    {"group": group_id, "topic": tp.topic, "partition": tp.partition}
                    for tp in partitions
                ],
                indent=2,
            )
        )
    else:
        print(
            format_table(
                ["TOPIC", "PARTITION", "STATUS"],
                [[tp.topic, tp.partition, "Successful"] for tp in partitions],
            )
        )
    return EXIT_OK

"""``kq quorum``: describe the quorum (as ``kafka-metadata-quorum.sh``), resign.

kq quorum describe --bootstrap-server H:P[,H:P...] --status|--replication [--json]
    [--human-readable]
kq quorum resign --bootstrap-server H:P[,H:P...] [--successor N] [--json]

Any bootstrap node is asked first; a node that is not the leader names the
leader, which is then asked, since only the leader knows every replica's
progress.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import grpc

from kq.commands.common import (
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_bootstrap_flag,
    add_command_group,
    bootstrap_addresses,
    client_credentials,
    command,
    format_fields,
    format_table,
    print_json,
    run_async,
)
from kqproto import quorum_pb2, quorum_pb2_grpc
from quorum.driver.client import RefusedError, describe
from quorum.driver.tls import dial

__all__ = ["find_leader", "register", "replication_rows", "status_fields"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "quorum",
        help="describe the quorum, or make its leader resign",
        description="Inspect and administer a running kq quorum.",
    )

    desc = commands.add_parser(
        "describe",
        help="the quorum's status or its replication progress",
        description=(
            "Describe the quorum as its leader sees it (like kafka-metadata-quorum.sh): "
            "--status prints ClusterId, LeaderId, LeaderEpoch, HighWatermark, "
            "MaxFollowerLag, MaxFollowerLagTimeMs, CurrentVoters, CurrentObservers; "
            "--replication prints each replica's LogEndOffset, Lag, LastFetchTimestamp, "
            "LastCaughtUpTimestamp and Status."
        ),
    )
    add_bootstrap_flag(desc)
    what = desc.add_mutually_exclusive_group(required=True)
    what.add_argument("--status", action="store_true", help="the quorum's status")
    what.add_argument("--replication", action="store_true", help="every replica's progress")
    desc.add_argument("--json", action="store_true", help="print JSON")
    desc.add_argument(
        "--human-readable",
        action="store_true",
        help="with --replication: timestamps as 'N ms ago'",
    )
    desc.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to find the leader (default 5)"
    )
    desc.set_defaults(func=_describe)

    resign = commands.add_parser(
        "resign",
        help="make the leader resign (it sends EndQuorumEpoch)",
        description=(
            "Make the current leader resign its epoch: it stops accepting writes and "
            "tells the voters, which elect a new leader at once. --successor N asks "
            "voter N to stand first."
        ),
    )
    add_bootstrap_flag(resign)
    resign.add_argument("--successor", type=int, metavar="N", help="the preferred successor")
    resign.add_argument("--json", action="store_true", help="print JSON")
    resign.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to find the leader (default 5)"
    )
    resign.set_defaults(func=_resign)


async def find_leader(
    bootstrap: list[str],
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None = None,
) -> tuple[str, quorum_pb2.DescribeQuorumResponse]:
    """The leader's address and its DescribeQuorum answer.

    Raises CommandError if no leader is found before the deadline, or at
    once if a node refuses the caller (its certificate lacks the ACL: asking
    again cannot help).
    """
    try:
        return await _find_leader(bootstrap, timeout_s, credentials)
    except RefusedError as exc:
        raise CommandError(str(exc)) from None


async def _find_leader(
    bootstrap: list[str],
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None,
) -> tuple[str, quorum_pb2.DescribeQuorumResponse]:
    deadline = time.monotonic() + timeout_s
    problems: dict[str, str] = {}
    while True:
        for address in bootstrap:
            budget = max(0.05, min(1.0, deadline - time.monotonic()))
            response = await describe(address, budget, credentials)
            if response is None:
                problems[address] = "unreachable"
                continue
            if response.role == "leader":
                return address, response
            hint = response.leader.leader_address
            if not hint:
                problems[address] = f"knows no leader (epoch {response.epoch}, {response.role})"
                continue
            leader = await describe(hint, budget, credentials)
            if leader is not None and leader.role == "leader":
                return hint, leader
            problems[address] = f"names leader {response.leader.leader_id} at {hint}, " + (
                "which is unreachable" if leader is None else f"which is {leader.role}"
            )
        if time.monotonic() >= deadline:
            detail = "; ".join(f"{a}: {why}" for a, why in problems.items())
            raise CommandError(f"no leader found within {timeout_s:g} s ({detail})")
        await asyncio.sleep(0.1)


def status_fields(r: quorum_pb2.DescribeQuorumResponse) -> dict[str, Any]:
    """The --status fields of a leader's answer (snake_case keys)."""
    followers = [x for x in r.replicas if x.voter and x.node_id != r.node_id]
    leader_row = next((x for x in r.replicas if x.node_id == r.node_id), None)
    max_lag = 0
    lag_time = 0
    if followers:
        worst = max(followers, key=lambda x: x.lag)
        max_lag = worst.lag
        if worst.lag == 0:
            lag_time = 0
        elif worst.last_caught_up_timestamp_ms < 0:
            lag_time = -1
        else:
            # As Kafka: the leader's last caught-up time (its now) minus the
            # most lagging follower's.
            now = (
                leader_row.last_caught_up_timestamp_ms
                if leader_row is not None and leader_row.last_caught_up_timestamp_ms >= 0
                else int(time.time() * 1000)
            )
            lag_time = max(0, now - worst.last_caught_up_timestamp_ms)
    return {
        "cluster_id": r.cluster_id,
        "leader_id": r.node_id,
        "leader_epoch": r.epoch,
        "high_watermark": r.high_watermark,
        "max_follower_lag": max_lag,
        "max_follower_lag_time_ms": lag_time,
        "current_voters": sorted(r.voters),
        "current_observers": sorted(x.node_id for x in r.replicas if not x.voter),
    }


def replication_rows(r: quorum_pb2.DescribeQuorumResponse) -> list[dict[str, Any]]:
    """One dict per replica: the leader first, then voters, then observers."""
    order = sorted(r.replicas, key=lambda x: (x.node_id != r.node_id, not x.voter, x.node_id))
    return [
        {
            "node_id": x.node_id,
            "log_end_offset": x.log_end_offset,
            "lag": x.lag,
            "last_fetch_timestamp": x.last_fetch_timestamp_ms,
            "last_caught_up_timestamp": x.last_caught_up_timestamp_ms,
            "status": x.status,
            "address": x.address,
        }
        for x in order
    ]


def _ago(timestamp_ms: int, now_ms: int) -> str:
    if timestamp_ms < 0:
        return "never"
    return f"{max(0, now_ms - timestamp_ms)} ms ago"


@command("quorum describe")
def _describe(args: argparse.Namespace) -> int:
    bootstrap = bootstrap_addresses(args)
    _, response = run_async(find_leader(bootstrap, args.timeout, client_credentials(args)))
    if args.status:
        fields = status_fields(response)
        if args.json:
            print_json(fields)
        else:
            print(
                format_fields(
                    {
                        "ClusterId": fields["cluster_id"],
                        "LeaderId": fields["leader_id"],
                        "LeaderEpoch": fields["leader_epoch"],
                        "HighWatermark": fields["high_watermark"],
                        "MaxFollowerLag": fields["max_follower_lag"],
                        "MaxFollowerLagTimeMs": fields["max_follower_lag_time_ms"],
                        "CurrentVoters": _ids(fields["current_voters"]),
                        "CurrentObservers": _ids(fields["current_observers"]),
                    }
                )
            )
        return 0
    rows = replication_rows(response)
    if args.json:
        print_json(rows)
        return 0
    now = int(time.time() * 1000)

    def when(ts: int) -> object:
        return _ago(ts, now) if args.human_readable else ts

    print(
        format_table(
            [
                "NodeId",
                "LogEndOffset",
                "Lag",
                "LastFetchTimestamp",
                "LastCaughtUpTimestamp",
                "Status",
            ],
            [
                [
                    row["node_id"],
                    row["log_end_offset"],
                    row["lag"],
                    when(row["last_fetch_timestamp"]),
                    when(row["last_caught_up_timestamp"]),
                    row["status"],
                ]
                for row in rows
            ],
        )
    )
    return 0


def _ids(ids: list[int]) -> str:
    return "[" + ",".join(map(str, ids)) + "]"


@command("quorum resign")
def _resign(args: argparse.Namespace) -> int:
    bootstrap = bootstrap_addresses(args)
    result = run_async(
        _do_resign(bootstrap, args.successor, args.timeout, client_credentials(args))
    )
    if args.json:
        print_json(result)
        return 0
    line = f"Node {result['resigned']} resigned the leadership of epoch {result['epoch']}"
    if result["new_leader"] is not None:
        line += f"; node {result['new_leader']} leads epoch {result['new_epoch']}"
    else:
        line += "; no new leader yet"
    print(line)
    return 0


async def _do_resign(
    bootstrap: list[str],
    successor: int | None,
    timeout_s: float,
    credentials: grpc.ChannelCredentials | None,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        address, leader = await find_leader(
            bootstrap, max(0.1, deadline - time.monotonic()), credentials
        )
        if successor is not None and (
            successor not in leader.voters or successor == leader.node_id
        ):
            raise CommandError(
                f"--successor {successor} must be a voter other than the leader "
                f"(leader {leader.node_id}, voters {_ids(sorted(leader.voters))})",
                EXIT_USAGE,
            )
        try:
            async with dial(address, credentials) as channel:
                stub = quorum_pb2_grpc.QuorumServiceStub(channel)
                answer: quorum_pb2.ResignResponse = await stub.Resign(
                    quorum_pb2.ResignRequest(
                        preferred_successors=[] if successor is None else [successor]
                    ),
                    timeout=max(0.1, deadline - time.monotonic()),
                )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                # A refusal is definite: the leader did nothing.
                raise CommandError(f"{address} refused Resign: {exc.details()}") from None
            raise CommandError(
                f"resign request to {address} failed ({exc.code().name}); the leader "
                "may or may not have resigned: check with `kq quorum describe --status`"
            ) from None
        if answer.error == quorum_pb2.NOT_LEADER:
            if time.monotonic() >= deadline:
                raise CommandError(f"node {leader.node_id} is no longer the leader")
            continue  # leadership moved meanwhile: find the new leader
        if answer.error != quorum_pb2.OK:
            raise CommandError(f"node {leader.node_id} refused to resign: {answer.message}")
        break
    # Wait (briefly) for the next leader, for the report.
    new_leader: int | None = None
    new_epoch: int | None = None
    wait_until = time.monotonic() + max(1.0, deadline - time.monotonic())
    while time.monotonic() < wait_until:
        try:
            _, now = await find_leader(
                bootstrap, min(1.0, wait_until - time.monotonic()), credentials
            )
        except CommandError:
            continue
        if now.epoch > leader.epoch:
            new_leader, new_epoch = now.node_id, now.epoch
            break
        await asyncio.sleep(0.05)
    return {
        "resigned": leader.node_id,
        "epoch": leader.epoch,
        "new_leader": new_leader,
        "new_epoch": new_epoch,
    }

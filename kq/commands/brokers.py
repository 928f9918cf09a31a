"""``kq brokers``: list the registered brokers, unregister one.

kq brokers list            id, rack, state (fenced, unfenced,
                           controlled-shutdown), broker epoch, endpoints
kq brokers unregister ID   remove a broker's registration

With ``--bootstrap``, ``--timeout`` and ``--json`` (and ``--stale`` for
list); exit statuses: see :mod:`kq.commands.admin`.
"""

from __future__ import annotations

import argparse
from typing import Any

from kq.commands.admin import add_common_flags, broker_id, call, linearizable
from kq.commands.common import (
    Subparsers,
    add_command_group,
    command,
    format_table,
    print_json,
)
from kqproto import metadata_pb2

__all__ = ["broker_json", "broker_rows", "broker_state", "register"]


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "brokers",
        help="list the registered brokers, or unregister one",
        description="The brokers registered with the cluster's controllers.",
    )

    listing = commands.add_parser(
        "list",
        help="every registered broker: id, rack, state, epoch, endpoints",
        description=(
            "Every registered broker. State: unfenced (may lead and be in ISRs), fenced "
            "(not caught up, session expired, or shut down) or controlled-shutdown (moving "
            "its leaderships away before it stops)."
        ),
    )
    add_common_flags(listing, stale=True)
    listing.set_defaults(func=_list)

    unregister = commands.add_parser(
        "unregister",
        help="remove a broker's registration",
        description=(
            "Remove broker ID's registration (of a broker that is gone for good); it "
            "leaves every ISR. A broker that is still running registers again."
        ),
    )
    unregister.add_argument("broker_id", type=broker_id, metavar="ID")
    add_common_flags(unregister)
    unregister.set_defaults(func=_unregister)


def broker_state(b: metadata_pb2.BrokerDescription) -> str:
    if b.in_controlled_shutdown:
        return "controlled-shutdown"
    return "fenced" if b.fenced else "unfenced"


def _endpoints(b: metadata_pb2.BrokerDescription) -> str:
    return ",".join(f"{e.name}://{e.host}:{e.port}" for e in b.endpoints)


def broker_rows(response: metadata_pb2.DescribeClusterResponse) -> list[list[object]]:
    return [
        [
            b.broker_id,
            b.rack if b.HasField("rack") else "-",
            broker_state(b),
            b.broker_epoch,
            _endpoints(b),
        ]
        for b in sorted(response.brokers, key=lambda b: b.broker_id)
    ]


def broker_json(b: metadata_pb2.BrokerDescription) -> dict[str, Any]:
    return {
        "id": b.broker_id,
        "rack": b.rack if b.HasField("rack") else None,
        "state": broker_state(b),
        "fenced": b.fenced,
        "in_controlled_shutdown": b.in_controlled_shutdown,
        "epoch": b.broker_epoch,
        "incarnation_id": b.incarnation_id,
        "log_dirs": list(b.log_dirs),
        "endpoints": [
            {
                "name": e.name,
                "host": e.host,
                "port": e.port,
                "security_protocol": e.security_protocol,
            }
            for e in b.endpoints
        ],
    }


@command("brokers list")
def _list(args: argparse.Namespace) -> int:
    response = call(args, lambda c: c.describe_cluster(linearizable=linearizable(args)))
    if args.json:
        print_json(
            {
                "cluster_id": response.cluster_id,
                "controller_id": response.controller_id,
                "brokers": [
                    broker_json(b) for b in sorted(response.brokers, key=lambda b: b.broker_id)
                ],
                "metadata_offset": response.metadata_offset,
            }
        )
        return 0
    print(format_table(["Id", "Rack", "State", "Epoch", "Endpoints"], broker_rows(response)))
    return 0


@command("brokers unregister")
def _unregister(args: argparse.Namespace) -> int:
    call(args, lambda c: c.unregister_broker(args.broker_id))
    if args.json:
        print_json({"ok": True, "broker_id": args.broker_id})
    else:
        print(f"Unregistered broker {args.broker_id}.")
    return 0

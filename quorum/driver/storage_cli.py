"""``kq storage``: format a node's data directory, make cluster ids, show one.

kq storage random-cluster-id
kq storage format --dir DIR --cluster-id ID --node-id N --voters 1,2,3
kq storage info --dir DIR
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quorum.driver.storage_format import (
    StorageFormatError,
    format_storage,
    random_cluster_id,
    read_meta,
)

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "storage",
        help="format and inspect a node's data directory",
        description=(
            "Prepare a node's data directory before its first start (as Kafka's "
            "kafka-storage tool does): a node refuses to start on a directory that "
            "is not formatted, or that was formatted for another cluster or node."
        ),
    )
    commands = parser.add_subparsers(dest="storage_command", metavar="SUBCOMMAND", required=True)

    rand = commands.add_parser(
        "random-cluster-id", help="print a new random cluster id (base64url UUID)"
    )
    rand.set_defaults(func=_random_cluster_id)

    fmt = commands.add_parser(
        "format",
        help="format a data directory for one node of one cluster",
        description="Write kq.meta.json into DIR; refuses a directory already formatted.",
    )
    fmt.add_argument("--dir", required=True, help="the node's data directory")
    fmt.add_argument("--cluster-id", required=True, help="e.g. from `kq storage random-cluster-id`")
    fmt.add_argument("--node-id", required=True, type=_node_id, help="this node's id")
    fmt.add_argument(
        "--voters", required=True, type=_voters, help="comma-separated voter ids, e.g. 1,2,3"
    )
    fmt.set_defaults(func=_format)

    info = commands.add_parser("info", help="print the metadata of a formatted data directory")
    info.add_argument("--dir", required=True, help="the node's data directory")
    info.set_defaults(func=_info)

    parser.set_defaults(func=lambda args: parser.error("a storage subcommand is required"))


def _node_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a node id: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"node ids are non-negative, got {value}")
    return value


def _voters(text: str) -> list[int]:
    ids = [_node_id(part.strip()) for part in text.split(",") if part.strip()]
    if not ids:
        raise argparse.ArgumentTypeError("at least one voter is needed")
    return ids


def _random_cluster_id(args: argparse.Namespace) -> int:
    print(random_cluster_id())
    return 0


def _format(args: argparse.Namespace) -> int:
    try:
        meta = format_storage(args.dir, args.cluster_id, args.node_id, args.voters)
    except (StorageFormatError, ValueError, OSError) as exc:
        print(f"kq storage format: {exc}", file=sys.stderr)
        return 1
    print(
        f"Formatted {args.dir} for cluster {meta.cluster_id} node {meta.node_id} "
        f"(voters {','.join(map(str, meta.voters.sorted()))})"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    try:
        meta = read_meta(args.dir)
    except StorageFormatError as exc:
        print(f"kq storage info: {exc}", file=sys.stderr)
        return 1
    print(meta.to_json())
    return 0

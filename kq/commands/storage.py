"""``kq storage``: format a node's data directory, make cluster ids, show one.

kq storage random-cluster-id
kq storage format --dir DIR --cluster-id ID --node-id N --voters 1@h:p,2@h:p,...
kq storage format --config FILE [overrides]
kq storage info --dir DIR [--json]

As Kafka's ``kafka-storage`` tool: a node refuses to start on a directory that
is not formatted, or that was formatted for another cluster or node.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from pathlib import Path

from kq.commands.common import (
    EXIT_USAGE,
    CommandError,
    Subparsers,
    add_command_group,
    command,
    format_fields,
    print_json,
)
from kq.commands.config_flags import add_config_flags, settings_from_args
from quorum.driver.storage_format import (
    META_FILE,
    StorageFormatError,
    format_storage,
    random_cluster_id,
    read_meta,
)
from server.broker import LogDirFormatError, format_log_dirs
from server.config import ConfigError

__all__ = ["register"]

# quorum.driver.snapshot_files names a snapshot <end offset>-<epoch>.checkpoint.
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


def register(subparsers: Subparsers) -> None:
    commands = add_command_group(
        subparsers,
        "storage",
        help="format and inspect a node's data directory",
        description=(
            "Prepare a node's data directory before its first start (as Kafka's "
            "kafka-storage tool does): a node refuses to start on a directory that "
            "is not formatted, or that was formatted for another cluster or node."
        ),
    )

    rand = commands.add_parser(
        "random-cluster-id",
        help="print a new random cluster id (base64url UUID)",
        description="Print a new random cluster id: a UUID in unpadded base64url.",
    )
    rand.set_defaults(func=_random_cluster_id)

    fmt = commands.add_parser(
        "format",
        help="format a data directory for one node of one cluster",
        description=(
            f"Write {META_FILE} into the node's data directory (created if missing). "
            "Refuses a directory that is already formatted or not empty. The settings "
            "may come from --config FILE (node_id, cluster_id, data_dir, voters), "
            "KQ_* variables and flags, as for `kq controller start`."
        ),
    )
    add_config_flags(
        fmt,
        data_dir_flag="--dir",
        keys=("node_id", "cluster_id", "data_dir", "voters"),
    )
    fmt.set_defaults(func=_format)

    info = commands.add_parser(
        "info",
        help="print the metadata of a formatted data directory",
        description="Print the cluster id, node id and voters a data directory was formatted for.",
    )
    info.add_argument("--dir", required=True, help="the node's data directory")
    info.add_argument("--json", action="store_true", help="print it as JSON")
    info.set_defaults(func=_info)


@command("storage random-cluster-id")
def _random_cluster_id(args: argparse.Namespace) -> int:
    print(random_cluster_id())
    return 0


@command("storage format")
def _format(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args, data_dir_flag="--dir")
        data_dir: Path = settings.require("data_dir", "--dir")
        cluster_id: str = settings.require("cluster_id", "--cluster-id")
        node_id: int = settings.require("node_id", "--node-id")
        voters: dict[int, str] = settings.require("voters", "--voters")
    except ConfigError as exc:
        raise CommandError(f"config error: {exc}", EXIT_USAGE) from None
    try:
        meta = format_storage(data_dir, cluster_id, node_id, voters.keys())
    except (StorageFormatError, ValueError, OSError) as exc:
        raise CommandError(str(exc)) from None
    print(
        f"Formatted {data_dir} for cluster {meta.cluster_id} node {meta.node_id} "
        f"(voters {','.join(map(str, meta.voters.sorted()))})"
    )
    # A broker's configuration names its log directories too.
    log_dirs: tuple[Path, ...] | None = settings.get("broker.log_dirs")
    if log_dirs:
        try:
            stamped = format_log_dirs(log_dirs, cluster_id, node_id)
        except (LogDirFormatError, OSError) as exc:
            raise CommandError(str(exc)) from None
        for directory in log_dirs:
            done = "Formatted" if directory in stamped else "Already formatted"
            print(f"{done} log directory {directory} for cluster {cluster_id} broker {node_id}")
    return 0


@command("storage info")
def _info(args: argparse.Namespace) -> int:
    path = Path(args.dir)
    try:
        meta = read_meta(path)
    except StorageFormatError as exc:
        raise CommandError(str(exc)) from None
    snapshots = []
    snapshot_dir = path / "snapshots"
    if snapshot_dir.is_dir():
        for name in sorted(os.listdir(snapshot_dir)):
            match = _SNAPSHOT_NAME.match(name)
            if match:
                snapshots.append({"end_offset": int(match[1]), "epoch": int(match[2])})
    info = {
        "data_dir": str(path),
        "cluster_id": meta.cluster_id,
        "node_id": meta.node_id,
        "voters": meta.voters.sorted(),
        "created": meta.created,
        "version": meta.version,
        "bytes": _size(path),
        "snapshots": snapshots,
    }
    if args.json:
        print_json(info)
        return 0
    latest = max(snapshots, key=lambda s: s["end_offset"]) if snapshots else None
    print(
        format_fields(
            {
                "DataDir": path,
                "ClusterId": meta.cluster_id,
                "NodeId": meta.node_id,
                "Voters": ",".join(map(str, meta.voters.sorted())),
                "Formatted": meta.created,
                "MetaVersion": meta.version,
                "Bytes": info["bytes"],
                "Snapshots": len(snapshots),
                "LatestSnapshot": "none"
                if latest is None
                else f"end offset {latest['end_offset']}, epoch {latest['epoch']}",
            }
        )
    )
    return 0


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total

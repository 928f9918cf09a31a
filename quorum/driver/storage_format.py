"""Formatting a node's data directory, and opening it only for its owner.

As with Kafka's ``kafka-storage format`` and its ``meta.properties``, a data
directory is formatted once, before the node first starts, with the cluster id
and the node id it belongs to; the node then refuses to start on a directory
that is not formatted or that belongs to another cluster or node, so a
misplaced or swapped disk can never be taken for this node's log and vote.

Layout of a formatted directory::

    kq.meta.json   {"version": 1, "cluster_id": ..., "node_id": ...,
                    "voters": [...], "created": "<ISO-8601 UTC>"}
    rocksdb/       created on first open (see quorum.driver.rocks)
    snapshots/     created on first open (see quorum.driver.snapshot_files)

``kq.meta.json`` is written atomically: a temporary file, fsync, rename,
fsync of the directory.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from quorum.driver.rocks import PowerLossRocksStorage, RocksStorage
from quorum.driver.snapshot_files import fsync_dir
from quorum.types import NodeId, VoterSet

__all__ = [
    "META_FILE",
    "META_VERSION",
    "StorageFormatError",
    "StorageMeta",
    "format_storage",
    "open_node_storage",
    "random_cluster_id",
    "read_meta",
]

META_FILE = "kq.meta.json"
META_VERSION = 1


class StorageFormatError(Exception):
    """The data directory is not formatted, formatted twice, malformed, or
    belongs to another cluster or node."""


@dataclass(frozen=True, slots=True)
class StorageMeta:
    cluster_id: str
    node_id: NodeId
    voters: VoterSet
    created: str
    version: int = META_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "cluster_id": self.cluster_id,
                "node_id": self.node_id,
                "voters": self.voters.sorted(),
                "created": self.created,
            },
            indent=2,
        )


def random_cluster_id() -> str:
    """A new cluster id: a random UUID in unpadded base64url, 22 characters,
    as Kafka's ``Uuid.randomUuid().toString()`` (never starting with ``-``,
    so that it cannot be taken for a command-line option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def _check_cluster_id(cluster_id: str) -> None:
    if not isinstance(cluster_id, str) or not cluster_id:
        raise ValueError("the cluster id must be a non-empty string")
    if (
        not cluster_id.isascii()
        or not cluster_id.isprintable()
        or any(c.isspace() for c in cluster_id)
    ):
        raise ValueError(f"the cluster id {cluster_id!r} must be printable ASCII without spaces")


def _check_node_id(node_id: int) -> None:
    if not isinstance(node_id, int) or isinstance(node_id, bool) or node_id < 0:
        raise ValueError(f"the node id must be a non-negative integer, got {node_id!r}")


def format_storage(
    directory: str | os.PathLike[str],
    cluster_id: str,
    node_id: NodeId,
    voters: VoterSet | Iterable[NodeId],
) -> StorageMeta:
    """Format ``directory`` (created if missing) for ``node_id`` of ``cluster_id``.

    Refuses a directory already formatted (saying for which cluster and node)
    or holding anything else, so that no data is ever formatted over.
    """
    _check_cluster_id(cluster_id)
    _check_node_id(node_id)
    voter_set = voters if isinstance(voters, VoterSet) else VoterSet(frozenset(voters))
    path = Path(directory)
    meta_path = path / META_FILE
    if meta_path.exists():
        try:
            existing = read_meta(path)
            owner = f"cluster {existing.cluster_id} node {existing.node_id}"
        except StorageFormatError as exc:
            owner = f"an unreadable {META_FILE} ({exc})"
        raise StorageFormatError(
            f"data directory {path} is already formatted for {owner}; refusing to "
            "format it again (remove the directory first to really start over)"
        )
    if path.exists():
        if not path.is_dir():
            raise StorageFormatError(f"{path} exists and is not a directory")
        contents = sorted(os.listdir(path))
        if contents:
            shown = ", ".join(contents[:5]) + (", ..." if len(contents) > 5 else "")
            raise StorageFormatError(
                f"data directory {path} is not empty ({shown}) and has no {META_FILE}; "
                "refusing to format over data of unknown origin"
            )
    created_dir = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    meta = StorageMeta(
        cluster_id=cluster_id,
        node_id=node_id,
        voters=voter_set,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    tmp = path / (META_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = (meta.to_json() + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, meta_path)
    fsync_dir(path)
    if created_dir:
        fsync_dir(path.parent)
    return meta


def read_meta(directory: str | os.PathLike[str]) -> StorageMeta:
    """The metadata of a formatted data directory, checked for shape."""
    path = Path(directory)
    meta_path = path / META_FILE
    if not meta_path.exists():
        raise StorageFormatError(
            f"data directory {path} is not formatted (no {META_FILE}); run "
            "`kq storage format` for this node first"
        )
    try:
        obj = json.loads(meta_path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StorageFormatError(f"{meta_path} is unreadable: {exc}") from exc
    if not isinstance(obj, dict):
        raise StorageFormatError(f"{meta_path} does not hold a JSON object")
    if obj.get("version") != META_VERSION:
        raise StorageFormatError(
            f"{meta_path} has unknown version {obj.get('version')!r} (expected {META_VERSION})"
        )
    cluster_id, node_id = obj.get("cluster_id"), obj.get("node_id")
    voters, created = obj.get("voters"), obj.get("created")
    try:
        if not isinstance(cluster_id, str) or not isinstance(node_id, int):
            raise ValueError("cluster_id must be a string and node_id an integer")
        _check_cluster_id(cluster_id)
        _check_node_id(node_id)
        if not isinstance(voters, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in voters
        ):
            raise ValueError("voters must be a list of node ids")
        voter_set = VoterSet(frozenset(voters))
        if not isinstance(created, str):
            raise ValueError("created must be a string")
    except ValueError as exc:
        raise StorageFormatError(f"{meta_path} is malformed: {exc}") from exc
    return StorageMeta(cluster_id, node_id, voter_set, created)


def open_node_storage(
    directory: str | os.PathLike[str],
    cluster_id: str,
    node_id: NodeId,
    *,
    lose_unsynced: bool = False,
) -> RocksStorage:
    """Open the stores of ``node_id`` of ``cluster_id`` in a formatted directory.

    Refuses a directory that is not formatted, or that belongs to another
    cluster or node, naming both.  The returned RocksStorage holds the log,
    the quorum state and a FileSnapshotStore (``.snapshots``); with
    ``lose_unsynced``, the power-loss test mode (:class:`PowerLossRocksStorage`).
    """
    path = Path(directory)
    meta = read_meta(path)
    if meta.cluster_id != cluster_id or meta.node_id != node_id:
        raise StorageFormatError(
            f"data directory {path} belongs to cluster {meta.cluster_id} node "
            f"{meta.node_id}, not cluster {cluster_id} node {node_id}; refusing to start"
        )
    return PowerLossRocksStorage(path) if lose_unsynced else RocksStorage(path)

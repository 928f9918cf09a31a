"""Formatting a data directory and opening it only for its own node."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from quorum.driver.storage_format import (
    META_FILE,
    StorageFormatError,
    format_storage,
    open_node_storage,
    random_cluster_id,
    read_meta,
)
from quorum.ready import Ready
from quorum.types import Batch, QuorumState, VoterSet


def test_format_then_open(tmp_path: Path) -> None:
    directory = tmp_path / "node-1"
    cluster = random_cluster_id()
    meta = format_storage(directory, cluster, 1, [1, 2, 3])
    assert meta.voters == VoterSet.of(1, 2, 3)
    on_disk = json.loads((directory / META_FILE).read_text())
    assert on_disk["version"] == 1
    assert on_disk["cluster_id"] == cluster
    assert on_disk["node_id"] == 1
    assert on_disk["voters"] == [1, 2, 3]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", on_disk["created"])
    assert read_meta(directory) == meta
    assert sorted(p.name for p in directory.iterdir()) == [META_FILE]
    with open_node_storage(directory, cluster, 1) as storage:
        storage.persist(
            Ready(entries=(Batch(0, 1, (b"x",)),), quorum_state=QuorumState(1), must_sync=True)
        )
    with open_node_storage(directory, cluster, 1) as storage:
        assert storage.log.read_all() == [Batch(0, 1, (b"x",))]
        assert storage.snapshots.latest() is None


def test_formatting_twice_is_refused(tmp_path: Path) -> None:
    format_storage(tmp_path / "d", "clusterA", 2, VoterSet.of(1, 2, 3))
    with pytest.raises(
        StorageFormatError, match="already formatted for cluster clusterA node 2; refusing"
    ):
        format_storage(tmp_path / "d", "clusterB", 3, [3])
    assert read_meta(tmp_path / "d").cluster_id == "clusterA"


def test_formatting_over_unknown_data_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "something").write_text("data")
    with pytest.raises(StorageFormatError, match="not empty .something. and has no kq.meta"):
        format_storage(tmp_path / "d", "c", 1, [1])
    (tmp_path / "empty").mkdir()
    format_storage(tmp_path / "empty", "c", 1, [1])  # an empty one is fine
    assert read_meta(tmp_path / "empty").node_id == 1


@pytest.mark.parametrize(("cluster", "node"), [("clusterB", 2), ("clusterA", 3), ("x", 9)])
def test_opening_for_another_cluster_or_node_is_refused(
    tmp_path: Path, cluster: str, node: int
) -> None:
    directory = tmp_path / "data"
    format_storage(directory, "clusterA", 2, [1, 2, 3])
    with pytest.raises(StorageFormatError) as info:
        open_node_storage(directory, cluster, node)
    assert str(info.value) == (
        f"data directory {directory} belongs to cluster clusterA node 2, "
        f"not cluster {cluster} node {node}; refusing to start"
    )
    assert not (directory / "rocksdb").exists()


def test_opening_an_unformatted_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageFormatError, match="is not formatted .no kq.meta.json."):
        open_node_storage(tmp_path, "c", 1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "unreadable"),
        ('{"version": 7}', "unknown version 7"),
        ('{"version": 1, "cluster_id": "c", "node_id": -1, "voters": [1], "created": ""}',
         "node id must be a non-negative"),
        ('{"version": 1, "cluster_id": "c", "node_id": 1, "voters": [], "created": ""}',
         "at least one voter"),
        ('{"version": 1, "cluster_id": "", "node_id": 1, "voters": [1], "created": ""}',
         "cluster id must be a non-empty"),
    ],
)  # fmt: skip
def test_a_malformed_meta_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / META_FILE).write_text(content)
    with pytest.raises(StorageFormatError, match=message):
        open_node_storage(tmp_path, "c", 1)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cluster id"):
        format_storage(tmp_path / "a", "has space", 1, [1])
    with pytest.raises(ValueError, match="node id"):
        format_storage(tmp_path / "b", "c", -1, [1])
    with pytest.raises(ValueError, match="at least one voter"):
        format_storage(tmp_path / "c", "c", 1, [])
    assert not any(tmp_path.iterdir())


def test_random_cluster_ids() -> None:
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id)
        assert not cluster_id.startswith("-")

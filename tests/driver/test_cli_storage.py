"""``kq storage``: format (flags or a config file), its refusals, info."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kq.cli import main
from quorum.driver.storage_format import read_meta

VOTERS = "1@127.0.0.1:9091,2@127.0.0.1:9092,3@127.0.0.1:9093"


def test_random_cluster_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["storage", "random-cluster-id"]) == 0
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", capsys.readouterr().out.strip())


def test_format_then_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "n2"
    args = ["storage", "format", "--dir", str(d), "--cluster-id", "c1", "--node-id", "2"]
    assert main([*args, "--voters", VOTERS]) == 0
    assert "cluster c1 node 2 (voters 1,2,3)" in capsys.readouterr().out
    meta = read_meta(d)
    assert (meta.cluster_id, meta.node_id, meta.voters.sorted()) == ("c1", 2, [1, 2, 3])
    assert main(["storage", "info", "--dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ClusterId:\s+c1", out) and re.search(r"NodeId:\s+2", out)
    assert main(["storage", "info", "--dir", str(d), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["node_id"] == 2 and info["voters"] == [1, 2, 3] and info["snapshots"] == []


def test_formatting_twice_is_refused_naming_dir_cluster_and_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "n1"
    args = ["storage", "format", "--dir", str(d), "--node-id", "1", "--voters", VOTERS]
    assert main([*args, "--cluster-id", "first"]) == 0
    capsys.readouterr()
    assert main([*args, "--cluster-id", "second"]) == 1
    err = capsys.readouterr().err
    assert str(d) in err and "already formatted for cluster first node 1" in err
    assert read_meta(d).cluster_id == "first"


def test_format_from_a_config_file_with_overrides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        'node_id = 1\ncluster_id = "from-file"\ndata_dir = "data"\n'
        '[voters]\n1 = "127.0.0.1:9091"\n2 = "127.0.0.1:9092"\n'
    )
    monkeypatch.setenv("KQ_CLUSTER_ID", "from-env")
    assert main(["storage", "format", "--config", str(config), "--node-id", "2"]) == 0
    meta = read_meta(tmp_path / "data")  # relative to the config file
    assert (meta.cluster_id, meta.node_id) == ("from-env", 2)
    capsys.readouterr()
    # A bad value or unknown key is a usage error (2) naming key and source.
    assert main(["storage", "format", "--config", str(config), "--set", "x=1"]) == 2
    assert "unknown key 'x' in flag --set x=1" in capsys.readouterr().err
    monkeypatch.setenv("KQ_NODE_ID", "two")
    assert main(["storage", "format", "--config", str(config)]) == 2
    assert "environment variable KQ_NODE_ID" in capsys.readouterr().err


def test_missing_settings_and_unformatted_info(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["storage", "format", "--dir", str(tmp_path / "x"), "--voters", "1"]) == 2
    assert "missing required setting 'cluster_id'" in capsys.readouterr().err
    assert main(["storage", "info", "--dir", str(tmp_path / "none")]) == 1
    assert "is not formatted" in capsys.readouterr().err

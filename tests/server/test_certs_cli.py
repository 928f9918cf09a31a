"""``kq certs`` as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kq.cli import main


def test_create_issue_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "certs")
    assert main(["certs", "create-ca", "--certs-dir", d, "--cluster-id", "abc"]) == 0
    assert "Created the CA of cluster abc" in capsys.readouterr().out
    args = ["certs", "issue", "--certs-dir", d, "--node", "3", "--role", "broker"]
    assert main([*args, "--host", "127.0.0.3", "--json"]) == 0
    issued = json.loads(capsys.readouterr().out)
    assert issued["identity"] == "kq://abc/broker/3"
    assert main(["certs", "issue", "--certs-dir", d, "--user", "ops"]) == 0
    capsys.readouterr()
    assert main(["certs", "list", "--certs-dir", d, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["file"] for c in listed] == ["ca.crt", "broker-3.crt", "user-ops.crt"]
    assert listed[1]["hosts"] == ["127.0.0.3"]


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (["issue", "--node", "1"], 2, "--node needs --role"),
        (["issue", "--user", "ops", "--role", "broker"], 2, "--role goes with --node"),
        (["issue", "--user", "no spaces"], 2, "user name 'no spaces'"),
        (["issue", "--node", "1", "--role", "controller", "--host", "a b"], 2, "neither an IP"),
        (["create-ca", "--cluster-id", "abc"], 2, "would untrust every certificate"),
        (["create-ca", "--cluster-id", "a/b", "--force"], 2, "cluster id 'a/b'"),
    ],
)
def test_bad_requests_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], status: int, words: str
) -> None:
    d = str(tmp_path / "certs")
    assert main(["certs", "create-ca", "--certs-dir", d, "--cluster-id", "abc"]) == 0
    capsys.readouterr()
    assert main(["certs", args[0], "--certs-dir", d, *args[1:]]) == status
    assert words in capsys.readouterr().err


def test_no_ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "list", "--certs-dir", str(tmp_path)]) == 1
    assert "no CA in" in capsys.readouterr().err
    assert main(["certs", "issue", "--certs-dir", str(tmp_path), "--user", "u"]) == 1
    assert "create one with `kq certs create-ca`" in capsys.readouterr().err

"""``kq kv`` exit statuses: 0 ok, 1 definite failure or not found, 3 indeterminate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kq.cli import main
from kvstore.client import CasOutcome, KvClient, ReadResult
from quorum.driver.client import ClientError, IndeterminateWriteError
from quorum.types import OffsetAndEpoch
from tests.driver.cluster_util import free_ports

B = ["--bootstrap-server", "127.0.0.1:1"]


def fake(monkeypatch: pytest.MonkeyPatch, name: str, result: Any) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    async def method(self: KvClient, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(KvClient, name, method)
    return calls


def test_put_ok(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = fake(monkeypatch, "put", OffsetAndEpoch(offset=7, epoch=2))
    assert main(["kv", "put", "k", "v", *B]) == 0
    assert calls == [("k", b"v")]
    assert "offset 7, epoch 2" in capsys.readouterr().out
    assert main(["kv", "put", "k", "v", *B, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "key": "k", "offset": 7, "epoch": 2}


def test_an_indeterminate_write_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "put", IndeterminateWriteError("Put to x failed after it was sent"))
    assert main(["kv", "put", "k", "v", *B]) == 3
    err = capsys.readouterr().err
    assert "indeterminate" in err and "may or may not have committed" in err
    fake(monkeypatch, "delete", IndeterminateWriteError("leadership lost"))
    assert main(["kv", "delete", "k", *B, "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "indeterminate" and "may or may not" in out["message"]


def test_a_definite_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake(monkeypatch, "put", ClientError("the key is too long"))
    assert main(["kv", "put", "k", "v", *B]) == 1
    assert "failed: the key is too long" in capsys.readouterr().err


def test_get(monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    calls = fake(
        monkeypatch, "get", ReadResult(True, b"val", OffsetAndEpoch(offset=3, epoch=1), 5, "n")
    )
    assert main(["kv", "get", "k", *B]) == 0
    assert capsysbinary.readouterr().out == b"val\n"
    fake(monkeypatch, "get", ReadResult(False, None, None, 5, "n"))
    assert main(["kv", "get", "k", *B]) == 1
    assert b"not found" in capsysbinary.readouterr().err
    assert main(["kv", "get", "k", *B, "--json"]) == 1
    assert json.loads(capsysbinary.readouterr().out)["present"] is False
    assert calls == [("k",)]


def test_cas(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = fake(monkeypatch, "cas", CasOutcome(True, OffsetAndEpoch(offset=4, epoch=1)))
    assert main(["kv", "cas", "k", "old", "new", *B]) == 0
    assert main(["kv", "cas", "k", "new", "--expect-absent", *B]) == 0
    assert calls == [("k", b"old", b"new"), ("k", None, b"new")]
    fake(monkeypatch, "cas", CasOutcome(False, OffsetAndEpoch(offset=4, epoch=1), b"other"))
    assert main(["kv", "cas", "k", "old", "new", *B]) == 1
    assert "precondition failed: it holds 'other'" in capsys.readouterr().err
    assert main(["kv", "cas", "k", "old", "new", *B, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "precondition_failed" and out["current_value"] == "other"
    assert main(["kv", "cas", "k", "new", *B]) == 2  # EXPECTED missing
    assert main(["kv", "cas", "k", "a", "b", "--expect-absent", *B]) == 2


def test_no_reachable_node_is_a_definite_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    args = ["--bootstrap-server", address, "--timeout", "0.5"]
    assert main(["kv", "put", "k", "v", *args]) == 1
    assert "no leader accepted the write" in capsys.readouterr().err
    assert main(["kv", "get", "k", *args]) == 1
    # Without --bootstrap-server and no local cluster: a usage error.
    assert main(["kv", "get", "k", "--cluster-dir", str(tmp_path)]) == 2
    assert "--bootstrap-server is required" in capsys.readouterr().err

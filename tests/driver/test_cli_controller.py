"""``kq controller start``: refusals, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kq.cli import main
from metadata.client import MetadataClient
from quorum.driver.client import describe
from quorum.driver.storage_format import format_storage
from quorum.driver.tls import TlsFiles
from tests.driver.cluster_util import free_ports


def config_file(tmp_path: Path, port: int, node_id: int = 1, voters: str = "") -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        f'node_id = {node_id}\ncluster_id = "c1"\ndata_dir = "data"\n'
        f'voters = "{voters or f"1@127.0.0.1:{port}"}"\n'
        "[quorum]\nelection_timeout_ms = 150\nfetch_timeout_ms = 400\n"
        "fetch_max_wait_ms = 100\nrequest_timeout_ms = 150\n"
    )
    return path


def test_refuses_an_unformatted_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, free_ports(1)[0])
    assert main(["controller", "start", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"data directory {tmp_path / 'data'} is not formatted" in err


def test_refuses_a_data_dir_of_another_cluster_or_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, free_ports(1)[0])
    format_storage(tmp_path / "data", "other", 1, [1])
    assert main(["controller", "start", "--config", str(path)]) == 1
    assert "belongs to cluster other node 1, not cluster c1 node 1" in capsys.readouterr().err


def test_refuses_voters_other_than_formatted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_ports(1)[0]
    path = config_file(tmp_path, port, voters=f"1@127.0.0.1:{port},2@127.0.0.1:{port + 1}")
    format_storage(tmp_path / "data", "c1", 1, [1])
    assert main(["controller", "start", "--config", str(path)]) == 1
    assert "formatted for voters 1 but the configuration names voters 1,2" in (
        capsys.readouterr().err
    )


async def _wait_role(address: str, role: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = await describe(address, 0.5)
        if answer is not None and answer.role == role:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{address} did not become {role} within {timeout_s} s")


def test_sigterm_resigns_and_exits_0(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    path = config_file(tmp_path, port)
    format_storage(tmp_path / "data", "c1", 1, [1])
    log_file = tmp_path / "node.log"
    pid_file = tmp_path / "node.pid"
    cmd = [sys.executable, "-m", "kq.cli", "controller", "start", "--config", str(path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KQ_")}
    started: list[subprocess.Popen[bytes]] = []
    try:
        proc = subprocess.Popen(
            [*cmd, "--log-file", str(log_file), "--pid-file", str(pid_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        started.append(proc)
        asyncio.run(_wait_role(f"127.0.0.1:{port}", "leader", 20))
        assert pid_file.read_text().strip() == str(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err.decode()
        text = log_file.read_text()
        assert "received SIGTERM" in text
        assert "leads epoch 1: resigning before it stops" in text
        assert "node 1 stopped cleanly" in text
        assert not pid_file.exists()
        # A second start on the same data continues where it left off; SIGINT
        # stops it as cleanly.
        again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        started.append(again)
        asyncio.run(_wait_role(f"127.0.0.1:{port}", "leader", 20))
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=15) == 0
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_a_controller_with_tls_in_its_config_serves_only_certified_callers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_ports(1)[0]
    path = config_file(tmp_path, port)
    certs = tmp_path / "certs"
    assert main(["certs", "create-ca", "--certs-dir", str(certs), "--cluster-id", "c1"]) == 0
    assert (
        main(["certs", "issue", "--certs-dir", str(certs), "--node", "1", "--role", "controller"])
        == 0
    )
    assert main(["certs", "issue", "--certs-dir", str(certs), "--user", "ops"]) == 0
    # Half a [tls] section is refused, naming what is missing.
    path.write_text(path.read_text() + '[tls]\nca_file = "certs/ca.crt"\n')
    assert main(["controller", "start", "--config", str(path)]) == 2
    assert "tls.cert_file, tls.key_file missing" in capsys.readouterr().err
    path.write_text(
        path.read_text()
        + 'cert_file = "certs/controller-1.crt"\nkey_file = "certs/controller-1.key"\n'
        # Over TLS, callers need ACLs; ops is a super user (docs/security.md).
        + '[authorizer]\nsuper_users = ["User:ops"]\n'
    )
    format_storage(tmp_path / "data", "c1", 1, [1])
    cmd = [sys.executable, "-m", "kq.cli", "controller", "start", "--config", str(path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KQ_")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        ops = TlsFiles.in_folder(certs, "user-ops").channel_credentials()
        address = f"127.0.0.1:{port}"

        async def check() -> None:
            deadline = time.monotonic() + 20
            answer = None
            while time.monotonic() < deadline:
                answer = await describe(address, 0.5, ops)
                if answer is not None and answer.role == "leader":
                    break
                await asyncio.sleep(0.05)
            assert answer is not None and answer.role == "leader"
            assert await describe(address, 0.5) is None  # plaintext: no handshake
            # The metadata services on the same port, over the same TLS.
            async with MetadataClient([address], timeout_s=10, credentials=ops) as admin:
                features = await admin.describe_features(linearizable=True)
            assert [f.name for f in features.features] == ["metadata.version"]

        asyncio.run(check())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

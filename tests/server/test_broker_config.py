"""A broker's configuration (the controllers' keys and its [broker]
section, TOML < KQ_* < flags), its log directories' stamps, and `kq broker
start` as a real process against three controllers over TLS: it registers,
is unfenced, and on SIGTERM shuts down under control and exits 0."""

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
from quorum.driver.identity import Identity
from quorum.driver.identity import Role as IdentityRole
from server.broker import (
    LogDirFormatError,
    broker_config,
    check_log_dirs,
    format_log_dirs,
)
from server.config import ConfigError, load_settings
from tests.driver.cluster_util import CLUSTER_ID, free_ports
from tests.metadata.test_metadata_replication import OPTIONS
from tests.server.test_broker_process import Controllers


def write_config(tmp_path: Path, voters: str, port: int, node_id: int = 11) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(
        f'node_id = {node_id}\ncluster_id = "{CLUSTER_ID}"\ndata_dir = "metadata"\n'
        f'voters = "{voters}"\nlisten = "127.0.0.1:{port}"\n'
        '[broker]\nlog_dirs = ["logs-a", "logs-b"]\nrack = "r1"\n'
        "[quorum]\nelection_timeout_ms = 150\nfetch_timeout_ms = 400\n"
        "fetch_max_wait_ms = 100\nrequest_timeout_ms = 150\n"
    )
    return path


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write_config(tmp_path, "1@127.0.0.1:9001,2@127.0.0.1:9002", 9011)
    settings = load_settings(
        path,
        {"KQ_BROKER_RACK": "r2", "KQ_BROKER_HEARTBEAT_INTERVAL_MS": "300"},
        [("broker.heartbeat_interval_ms", "100", "flag --set")],
    )
    config = broker_config(settings)
    assert config.node_id == 11 and config.cluster_id == CLUSTER_ID
    assert config.voters == {1: "127.0.0.1:9001", 2: "127.0.0.1:9002"}
    assert config.metadata_dir == tmp_path / "metadata"
    # Relative directories are the config file's.
    assert list(config.log_dirs) == [tmp_path / "logs-a", tmp_path / "logs-b"]
    assert config.listen == "127.0.0.1:9011"
    assert config.rack == "r2"
    assert config.heartbeat_interval_ms == 100
    assert config.tls is None
    assert config.options.quorum.election_timeout_ms == 150


def test_refused_configurations_name_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, "1@127.0.0.1:9001", 9011, node_id=1)
    with pytest.raises(ConfigError, match="broker 1 .* is also a controller"):
        broker_config(load_settings(path, {}))
    path = write_config(tmp_path, "1@127.0.0.1:9001", 9011)
    with pytest.raises(ConfigError, match="broker.log_dirs"):
        broker_config(load_settings(path, {"KQ_BROKER_LOG_DIRS": " , "}))
    path.write_text(path.read_text().replace('listen = "127.0.0.1:9011"\n', ""))
    with pytest.raises(ConfigError, match="listen"):
        broker_config(load_settings(path, {}))


def test_log_directories_belong_to_one_cluster_and_broker(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(LogDirFormatError, match="not formatted"):
        check_log_dirs(dirs, "c1", 11)
    assert format_log_dirs(dirs, "c1", 11) == dirs
    # Formatting again changes nothing.
    assert format_log_dirs(dirs, "c1", 11) == []
    ids = check_log_dirs(dirs, "c1", 11)
    # Each directory has its own id (KIP-858's directory.id), kept.
    assert len(set(ids)) == 2 and check_log_dirs(dirs, "c1", 11) == ids
    with pytest.raises(LogDirFormatError, match="belongs to cluster 'c1', not 'c2'"):
        check_log_dirs(dirs, "c2", 11)
    with pytest.raises(LogDirFormatError, match="belongs to broker 11, not 12"):
        format_log_dirs(dirs, "c1", 12)


def test_a_directory_id_is_given_where_missing_and_a_copy_is_refused(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    format_log_dirs(dirs, "c1", 11)
    # A stamp of an older kq, without directory.id: given one at the check.
    meta = dirs[0] / "meta.properties"
    meta.write_text("version=1\ncluster.id=c1\nnode.id=11\n")
    ids = check_log_dirs(dirs, "c1", 11)
    assert "directory.id=" + ids[0] in meta.read_text()
    assert "cluster.id=c1" in meta.read_text()
    # A copied directory: two directories, one id.
    (dirs[1] / "meta.properties").write_text(meta.read_text())
    with pytest.raises(LogDirFormatError, match="have the same directory.id"):
        check_log_dirs(dirs, "c1", 11)
    # A reserved or malformed id is refused by name.
    meta.write_text("version=1\ncluster.id=c1\nnode.id=11\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAQ\n")
    with pytest.raises(LogDirFormatError, match="directory.id 'AAAAAAAAAAAAAAAAAAAAAQ'"):
        check_log_dirs(dirs, "c1", 11)


async def _broker_state(bootstrap: list[str], credentials: object, broker_id: int) -> str:
    async with MetadataClient(bootstrap, credentials=credentials) as client:  # type: ignore[arg-type]
        answer = await client.describe_cluster()
    for broker in answer.brokers:
        if broker.broker_id == broker_id:
            return "fenced" if broker.fenced else "unfenced"
    return "absent"


def test_kq_broker_start_registers_and_stops_under_control_on_sigterm(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = Controllers(tmp_path, voters=3, options=OPTIONS, tls=True)
        assert cluster.certs is not None
        for node in cluster.voters:
            await cluster.start(node)
        proc: subprocess.Popen[bytes] | None = None
        try:
            voters = ",".join(f"{n}@{a}" for n, a in cluster.voters.items())
            (port,) = free_ports(1)
            path = write_config(tmp_path, voters, port)
            tls = cluster.tls_files(Identity.node(CLUSTER_ID, IdentityRole.BROKER, 11))
            path.write_text(
                path.read_text()
                + f'[tls]\nca_file = "{tls.ca}"\ncert_file = "{tls.cert}"\nkey_file = "{tls.key}"\n'
                + '[authorizer]\nsuper_users = ["User:admin"]\n'
            )
            # A broker not formatted yet is refused.
            assert main(["broker", "start", "--config", str(path)]) == 1
            assert main(["storage", "format", "--config", str(path)]) == 0
            ids = check_log_dirs([tmp_path / "logs-a", tmp_path / "logs-b"], CLUSTER_ID, 11)
            log_file = tmp_path / "broker.log"
            env = {k: v for k, v in os.environ.items() if not k.startswith("KQ_")}
            proc = subprocess.Popen(
                [sys.executable, "-m", "kq.cli", "broker", "start", "--config", str(path)]
                + ["--log-file", str(log_file)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            admin = cluster.tls_files(Identity.user(CLUSTER_ID, "admin")).channel_credentials()
            bootstrap = list(cluster.voters.values())
            deadline = time.monotonic() + 30
            while await _broker_state(bootstrap, admin, 11) != "unfenced":
                assert proc.poll() is None, log_file.read_text()
                assert time.monotonic() < deadline, log_file.read_text()
                await asyncio.sleep(0.1)
            # It registered its log directories' ids (KIP-858).
            async with MetadataClient(bootstrap, credentials=admin) as client:
                described = await client.describe_cluster()
            (me,) = [b for b in described.brokers if b.broker_id == 11]
            assert list(me.log_dirs) == sorted(ids)
            proc.send_signal(signal.SIGTERM)
            loop = asyncio.get_running_loop()
            status = await loop.run_in_executor(None, lambda: proc.wait(timeout=30))
            text = log_file.read_text()
            assert status == 0, text
            assert "received SIGTERM: controlled shutdown" in text
            assert "broker 11 stopped" in text
            # The controller saw the controlled shutdown: fenced now.
            assert await _broker_state(bootstrap, admin, 11) == "fenced"
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            for node in list(cluster.servers):
                await cluster.stop(node)

    asyncio.run(asyncio.wait_for(body(), 90))

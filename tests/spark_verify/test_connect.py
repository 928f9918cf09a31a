"""``kq verify --remote sc://HOST:PORT``: verification through a Spark Connect
server, started here as docs/verification.md shows (bounded in time, bound
to loopback, stopped by its process group's id)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_verify.run import EXIT_INVALID, EXIT_VALID
from spark_verify.session import ConnectError, java_problem, remote_session
from tests.driver.cluster_util import free_ports
from tests.spark_verify.test_jepsen import INDEPENDENT_INVALID, INDEPENDENT_VALID
from tests.spark_verify.test_verify_runs import json_equivalent

KQ = str(Path(sys.executable).parent / "kq")
START_TIMEOUT_S = 240.0


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server on a free loopback port: its sc:// address."""
    problem = java_problem()
    if problem is not None:
        pytest.skip(f"no Spark Connect server without Java: {problem}")
    script = _spark_home() / "sbin" / "start-connect-server.sh"
    if not script.is_file():
        pytest.skip(f"this pyspark has no {script.name} (no Spark Connect server to start)")
    logs = tmp_path_factory.mktemp("connect-server")
    [port] = free_ports(1)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(logs),
        "SPARK_PID_DIR": str(logs),
    }
    command = [
        str(script),
        "--wait",
        "--master",
        "local[2]",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.driver.host=127.0.0.1",
    ]
    out = (logs / "server.out").open("w")
    proc = subprocess.Popen(
        command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                text = (logs / "server.out").read_text()[-3000:]
                pytest.skip(f"the Spark Connect server exited ({proc.returncode}): {text}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the Spark Connect server did not listen in {START_TIMEOUT_S:g} s")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        # The script, the JVM and its Python workers share the session's group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        out.close()


def _histories(root: Path) -> list[Path]:
    """A valid and an invalid Jepsen history (store folders) and the valid
    one in kq's format (a JSON Lines file)."""
    paths = []
    for name, text in (("edn-good", INDEPENDENT_VALID), ("edn-bad", INDEPENDENT_INVALID)):
        (root / name).mkdir(parents=True)
        (root / name / "history.edn").write_text(text)
        paths.append(root / name)
    (root / "json-good.jsonl").write_text(json_equivalent())
    paths.append(root / "json-good.jsonl")
    return paths


def _verify(paths: list[Path], remote: str, out: Path) -> tuple[int, dict[str, Any]]:
    command = [KQ, "verify", *map(str, paths), "--remote", remote, "--no-report"]
    command += ["--model", "cas-register"]
    done = subprocess.run(
        [*command, "--json", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.stdout, done.stderr[-3000:]
    verdict: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, verdict


@pytest.mark.spark
def test_kq_verify_runs_through_a_connect_server(connect_server: str, tmp_path: Path) -> None:
    paths = _histories(tmp_path / "runs")
    status, verdict = _verify(paths, connect_server, tmp_path / "out")
    assert status == EXIT_INVALID, verdict
    runs = {r["name"]: r for r in verdict["runs"]}
    assert {n: r["verdict"] for n, r in runs.items()} == {
        "edn-good": "valid",
        "edn-bad": "invalid",
        "json-good": "valid",
    }
    assert runs["json-good"]["ops"] == runs["edn-good"]["ops"] == 7
    (anomaly,) = verdict["checks"]["linearizable"]["anomalies"]
    assert (anomaly["run"], anomaly["key"]) == ("edn-bad", "1")
    assert str(verdict["master"]).startswith("Spark Connect (local")
    # Again on the same server (warm now): the same verdict.
    status, again = _verify(paths[::2], connect_server, tmp_path / "out2")
    assert status == EXIT_VALID and again["verdict"] == "valid"


def test_a_bad_remote_address_is_refused_naming_it() -> None:
    with pytest.raises(ConnectError, match=r"--remote takes sc://HOST:PORT .*'http://x:1'"):
        remote_session("http://x:1")


def test_remote_and_master_are_exclusive(tmp_path: Path) -> None:
    run = _histories(tmp_path)[0]
    done = subprocess.run(
        [KQ, "verify", str(run), "--master", "local[1]", "--remote", "sc://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--master and --remote are exclusive" in done.stderr

"""End to end: ``kq cluster up`` starts 3 controller processes; status, kv,
describe, killing the leader, ``kq cluster down``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from server.local_cluster import (
    METRICS_PORT_OFFSET,
    free_base_port,
    load_state,
    process_alive,
    run_kq,
)


def kq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_kq(*args, timeout_s=timeout)


def kq_json(*args: str) -> Any:
    done = kq(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_for(cond: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen within {timeout_s} s")
        time.sleep(0.2)


def leaders(status: Any) -> list[int]:
    return [n["node_id"] for n in status["nodes"] if n["role"] == "leader"]


@pytest.mark.slow
def test_cluster_up_status_kv_failover_down(tmp_path: Path) -> None:
    d = str(tmp_path / "cluster")
    base = free_base_port(3)
    seen_pids: dict[int, str] = {}  # pid -> the config file its command line names
    try:
        up = kq(
            "cluster", "up", "--dir", d, "--nodes", "3", "--brokers", "0", "--base-port", str(base),
            "--json",
        )  # fmt: skip
        state = load_state(d)
        assert state is not None
        for n in state.nodes:
            if n.pid is not None:
                seen_pids[n.pid] = str(state.path(n.config))
        assert up.returncode == 0, up.stderr
        assert len(json.loads(up.stdout)["nodes"]) == 3

        status = kq_json("cluster", "status", "--dir", d, "--json")
        assert [n["alive"] for n in status["nodes"]] == [True, True, True]
        assert [n["address"] for n in status["nodes"]] == [
            f"127.0.0.1:{base + i}" for i in range(3)
        ]
        # Each node serves its metrics beside its gRPC address, and says where.
        metrics = [n["metrics_address"] for n in status["nodes"]]
        assert metrics == [f"127.0.0.1:{base + METRICS_PORT_OFFSET + i}" for i in range(3)]
        for address in metrics:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
                assert b"kq_" in page.read()
        table = kq("cluster", "status", "--cluster-dir", d)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        header = next(line for line in lines if line.startswith("NodeId"))
        assert header.split()[:4] == ["NodeId", "Address", "Metrics", "Protocol"]
        row = next(line for line in lines if line.startswith("1 "))
        assert row.split()[1:4] == [f"127.0.0.1:{base}", metrics[0], "SSL"]
        assert len(leaders(status)) == 1
        leader = leaders(status)[0]

        # TLS by default: named by address, the nodes want the admin's
        # certificate, which --certs-dir gives.
        assert status["security_protocol"] == "SSL"
        assert {n["security_protocol"] for n in status["nodes"]} == {"SSL"}
        bootstrap = ",".join(n["address"] for n in status["nodes"])
        certs = ("--certs-dir", str(Path(d) / "certs"))
        put = kq("kv", "put", "greeting", "hello", "--bootstrap-server", bootstrap, *certs)
        assert put.returncode == 0, put.stderr
        got = kq("kv", "get", "greeting", "--bootstrap-server", bootstrap, *certs)
        assert (got.returncode, got.stdout) == (0, "hello\n"), got.stderr
        missing = kq("kv", "get", "nothing", "--bootstrap-server", bootstrap, *certs)
        assert missing.returncode == 1 and "not found" in missing.stderr

        described = kq_json(
            "quorum", "describe", "--status", "--json", "--bootstrap-server", bootstrap, *certs
        )
        assert described["leader_id"] == leader
        assert described["current_voters"] == [1, 2, 3]
        assert described["cluster_id"] == status["cluster_id"]
        assert described["high_watermark"] >= 2
        replication = kq_json(
            "quorum", "describe", "--replication", "--json", "--bootstrap-server", bootstrap, *certs
        )
        assert sorted(r["node_id"] for r in replication) == [1, 2, 3]
        assert [r["status"] for r in replication].count("Leader") == 1

        killed = kq("cluster", "kill", str(leader), "--dir", d)
        assert killed.returncode == 0, killed.stderr

        def new_leader() -> int | None:
            s = kq_json("cluster", "status", "--dir", d, "--json")
            found = leaders(s)
            return found[0] if len(found) == 1 and found[0] != leader else None

        successor = wait_for(new_leader, 20, "a new leader")
        assert successor != leader
        status = kq_json("cluster", "status", "--dir", d, "--json")
        by_id = {n["node_id"]: n for n in status["nodes"]}
        assert by_id[leader]["alive"] is False and by_id[leader]["role"] == "down"
        # The acknowledged write survived the failover.
        got = kq("kv", "get", "greeting", "--cluster-dir", d)
        assert (got.returncode, got.stdout) == (0, "hello\n"), got.stderr

        # Starting the cluster again while it runs is refused.
        again = kq("cluster", "up", "--dir", d)
        assert again.returncode == 1 and "already running" in again.stderr

        down = kq("cluster", "down", "--dir", d)
        assert down.returncode == 0, down.stderr
        for pid, marker in seen_pids.items():
            assert not process_alive(pid, marker), f"pid {pid} survived kq cluster down"
        after = load_state(d)
        assert after is not None and all(n.pid is None for n in after.nodes)
    finally:
        kq("cluster", "down", "--dir", d, "--timeout", "5")
        state = load_state(d) if (Path(d) / "cluster.json").exists() else None
        if state is not None:
            for n in state.nodes:
                if n.pid is not None:
                    seen_pids[n.pid] = str(state.path(n.config))
        for pid, marker in seen_pids.items():
            if process_alive(pid, marker):
                os.kill(pid, signal.SIGKILL)


def test_up_refuses_a_busy_port_and_bad_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kq.cli import main

    d = str(tmp_path / "c")
    assert main(["cluster", "status", "--dir", d]) == 1
    assert "no local cluster" in capsys.readouterr().err
    assert main(["cluster", "up", "--dir", d, "--set", "node_id=3"]) == 2
    assert "only quorum.*, node.*, controller.*, broker.*" in capsys.readouterr().err
    assert main(["cluster", "up", "--dir", d, "--set", "quorum.fetch_timeout_ms=x"]) == 2
    assert "bad value for 'quorum.fetch_timeout_ms'" in capsys.readouterr().err
    base = free_base_port(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 1))
        busy.listen()
        assert main(["cluster", "up", "--dir", d, "--nodes", "2", "--base-port", str(base)]) == 1
    assert f"127.0.0.1:{base + 1} (node 2)" in capsys.readouterr().err
    state = load_state(d)
    assert state is not None and all(n.pid is None for n in state.nodes)
    # The cluster exists now: its size and ports are fixed.
    assert main(["cluster", "up", "--dir", d, "--nodes", "3"]) == 2
    assert "has 2 nodes, not 3" in capsys.readouterr().err
    assert main(["cluster", "kill", "1", "--dir", d]) == 1
    assert "node 1 is not running" in capsys.readouterr().err
    assert main(["cluster", "kill", "9", "--dir", d]) == 1
    assert "has no node or broker 9" in capsys.readouterr().err


def test_cluster_dir_is_the_folders_name_and_dir_its_alias(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kq.cli import main

    d = str(tmp_path / "c")
    # The same flag as kq quorum's and kq kv's; --dir still works.
    for flag in ("--cluster-dir", "--dir"):
        assert main(["cluster", "status", flag, d]) == 1
        assert f"no local cluster in {d}" in capsys.readouterr().err
    base = free_base_port(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        assert (
            main(["cluster", "up", "--cluster-dir", d, "--nodes", "1", "--base-port", str(base)])
            == 1
        )
    state = load_state(d)
    assert state is not None and [n.address for n in state.nodes] == [f"127.0.0.1:{base}"]
    # TLS (the default) or not is chosen when a cluster is made, not later.
    assert main(["cluster", "up", "--cluster-dir", d, "--insecure"]) == 2
    assert "runs with TLS; --insecure applies to a new cluster" in capsys.readouterr().err
    with pytest.raises(SystemExit) as both:
        main(["cluster", "up", "--cluster-dir", d, "--insecure", "--tls"])
    assert both.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    # kq quorum finds the same cluster in the same folder (its node is down).
    assert main(["quorum", "describe", "--status", "--cluster-dir", d, "--timeout", "0.5"]) == 1
    assert f"127.0.0.1:{base}" in capsys.readouterr().err


def test_a_tls_cluster_and_the_commands_that_find_its_certificates(tmp_path: Path) -> None:
    d = str(tmp_path / "tls-cluster")
    base = free_base_port(3)
    try:
        up = kq(
            "cluster", "up", "--cluster-dir", d, "--base-port", str(base), "--tls",
            "--brokers", "0",
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "(SSL: mutual TLS)" in up.stdout and "WARNING" not in up.stderr
        certs = tmp_path / "tls-cluster" / "certs"
        assert {p.name for p in certs.glob("*.crt")} == {
            "ca.crt",
            "controller-1.crt",
            "controller-2.crt",
            "controller-3.crt",
            "user-admin.crt",
        }
        config = (tmp_path / "tls-cluster" / "node-1" / "config.toml").read_text()
        assert "[tls]" in config and "controller-1.crt" in config
        status = kq_json("cluster", "status", "--cluster-dir", d, "--json")
        assert status["tls"] is True and len(leaders(status)) == 1
        # The commands take the local cluster's certificate from --cluster-dir.
        put = kq("kv", "put", "k", "v", "--cluster-dir", d)
        assert put.returncode == 0, put.stderr
        got = kq("kv", "get", "k", "--cluster-dir", d)
        assert (got.returncode, got.stdout) == (0, "v\n"), got.stderr
        described = kq("quorum", "describe", "--status", "--cluster-dir", d)
        assert described.returncode == 0, described.stderr
        topics = kq("topics", "list", "--cluster-dir", d)
        assert topics.returncode == 0, topics.stderr
        # Named by address, the cluster wants a certificate: plaintext gets
        # no connection; --certs-dir gives one.
        bootstrap = f"127.0.0.1:{base}"
        plain = kq("kv", "get", "k", "--bootstrap-server", bootstrap, "--timeout", "2")
        assert plain.returncode != 0
        certified = kq("kv", "get", "k", "--bootstrap-server", bootstrap, "--certs-dir", str(certs))
        assert (certified.returncode, certified.stdout) == (0, "v\n"), certified.stderr
        missing = kq(
            "kv",
            "get",
            "k",
            "--bootstrap-server",
            bootstrap,
            "--certs-dir",
            str(certs),
            "--user",
            "nobody",
        )
        assert missing.returncode == 2 and "user-nobody.crt" in missing.stderr
        # Up again while it runs is refused, as for any cluster.
        again = kq("cluster", "up", "--cluster-dir", d)
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        kq("cluster", "down", "--cluster-dir", d)


def test_an_insecure_cluster_says_so_on_every_start(tmp_path: Path) -> None:
    d = str(tmp_path / "plain")
    base = free_base_port(1)
    try:
        up = kq(
            "cluster", "up", "--cluster-dir", d, "--nodes", "1", "--base-port", str(base),
            "--insecure", "--brokers", "0",
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "WARNING" in up.stderr and "PLAINTEXT" in up.stderr
        assert f"127.0.0.1:{base}" in up.stderr
        assert "(PLAINTEXT: insecure)" in up.stdout
        assert not (Path(d) / "certs").exists()
        config = (Path(d) / "node-1" / "config.toml").read_text()
        assert "[tls]" not in config
        assert 'listener_security_protocol_map = "CONTROLLER:PLAINTEXT"' in config
        status = kq_json("cluster", "status", "--cluster-dir", d, "--json")
        assert status["tls"] is False and status["security_protocol"] == "PLAINTEXT"
        assert [n["security_protocol"] for n in status["nodes"]] == ["PLAINTEXT"]
        # Plaintext needs no certificate.
        put = kq("kv", "put", "k", "v", "--bootstrap-server", f"127.0.0.1:{base}")
        assert put.returncode == 0, put.stderr
        # Restarting the node warns again, and so does the node's own log.
        assert kq("cluster", "kill", "1", "--cluster-dir", d).returncode == 0
        start = kq("cluster", "start", "1", "--cluster-dir", d)
        assert start.returncode == 0, start.stderr
        assert "WARNING" in start.stderr and "PLAINTEXT" in start.stderr
        log = (Path(d) / "node-1" / "controller.log").read_text()
        warnings = [
            line
            for line in log.splitlines()
            if "WARNING" in line and "listener CONTROLLER" in line and "PLAINTEXT" in line
        ]
        assert len(warnings) == 2, log  # one per start of the process
    finally:
        kq("cluster", "down", "--cluster-dir", d)


def test_node_processes_find_kq_in_this_source_tree() -> None:
    # The nodes run `python -m kq.cli` with the source tree first on their
    # path; its parent would let a folder named kq (a clone) shadow kq.
    from server import local_cluster

    first = local_cluster._child_env()["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(first) / "kq" / "cli.py").is_file(), first
    assert (Path(first) / "server" / "local_cluster.py").is_file(), first

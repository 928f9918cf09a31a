"""bench/partition.py: a cut stops a process's traffic both ways, healing
removes every rule and the cgroup, and without iptables the workload is
skipped with the reason."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from bench import harness, partition
from bench.partition import Cut, PartitionUnavailable, leftover_rules

CLIENT = """
import socket, sys, time
port = int(sys.argv[1])
while True:
    s = socket.socket(); s.settimeout(0.3)
    try:
        s.connect(("127.0.0.1", port)); s.sendall(b"ping"); s.recv(4)
        print("ok", flush=True)
    except OSError:
        print("cut", flush=True)
    finally:
        s.close()
    time.sleep(0.05)
"""


def _available() -> str | None:
    try:
        partition.check()
    except PartitionUnavailable as exc:
        return str(exc)
    return None


def _serve() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.05)
    return server, server.getsockname()[1]


def _answer(server: socket.socket, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        with conn:
            conn.settimeout(0.3)
            try:
                if conn.recv(4):
                    conn.sendall(b"pong")
            except OSError:
                pass


def _lines(proc: subprocess.Popen[str], server: socket.socket, seconds: float) -> list[str]:
    os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
    _answer(server, seconds)
    out = proc.stdout.read() or ""  # type: ignore[union-attr]
    return out.split()


@pytest.mark.skipif(_available() is not None, reason=str(_available()))
def test_a_cut_process_reaches_nothing_and_healing_removes_every_rule() -> None:
    server, port = _serve()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert "ok" in _lines(proc, server, 1.0)
        cut = Cut(proc.pid, [])
        with cut:
            assert leftover_rules(), "the cut hooks its chain"
            _lines(proc, server, 0.5)  # connections made before the cut settle
            during = _lines(proc, server, 1.5)
            assert during and set(during) == {"cut"}, during
        assert leftover_rules() == []
        assert not cut.group.exists()
        after = _lines(proc, server, 1.5)
        assert "ok" in after, after
    finally:
        proc.kill()
        proc.wait()
        server.close()


def test_without_iptables_the_partition_workload_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(partition, "_iptables", lambda: None)
    monkeypatch.setattr(partition.os, "geteuid", lambda: 0)
    with pytest.raises(PartitionUnavailable, match="no iptables command"):
        partition.check()

    class Unused:
        name = "x"

    logged: list[str] = []
    result = asyncio.run(
        partition.partition(
            Unused(),  # type: ignore[arg-type]
            3,
            harness.latency_summary,
            harness.now,
            logged.append,
        )
    )
    assert result == {"skipped": logged[0].split("skipped: ", 1)[1]}
    assert "no iptables command" in result["skipped"]
    table = harness.format_table("kq", {"partition": result})
    assert "partition trials: skipped (no iptables command" in table


def test_not_root_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition.os, "geteuid", lambda: 1000)
    with pytest.raises(PartitionUnavailable, match="needs root"):
        partition.check()


def test_the_floor_measures_a_stream_and_unary_calls() -> None:
    from bench import grpc_floor

    result = grpc_floor.measure(messages=50)
    assert set(result) == {"stream", "unary"}
    for r in result.values():
        assert r["round_trips_per_s"] > 0 and r["p50_ms"] > 0

"""One local cluster with network faults per host at a time: the second is
refused at once, naming the first; the lock goes with its holder, even one
killed without a chance to release it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos.host_lock import HostLock, HostLockBusy
from chaos.local import LocalCluster


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    with HostLock(Path("first-cluster"), lock):
        second = HostLock(Path("second-cluster"), lock)
        with pytest.raises(HostLockBusy, match=rf"pid {os.getpid()}, cluster first-cluster"):
            second.acquire()
    # Released: the next one takes it.
    with HostLock(Path("second-cluster"), lock):
        assert f"pid {os.getpid()}, cluster second-cluster" in lock.read_text()


def test_a_killed_holder_leaves_no_lock_behind(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    code = (
        "import sys, time; from pathlib import Path; from chaos.host_lock import HostLock; "
        f"held = HostLock(Path('other'), Path({str(lock)!r})); held.acquire(); "
        "print('held', flush=True); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(HostLockBusy, match=rf"pid {proc.pid}, cluster other"):
            HostLock(Path("mine"), lock).acquire()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 5
    while True:
        try:
            HostLock(Path("mine"), lock).acquire()
            break
        except HostLockBusy:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_local_cluster_with_network_faults_is_refused_while_another_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before it installs a rule or starts a process (the lock
    comes first), so no iptables is needed to see it."""
    lock = tmp_path / "host.lock"
    monkeypatch.setattr("chaos.host_lock.default_lock_path", lambda: lock)
    with HostLock(Path("the-other-cluster"), lock):
        cluster = LocalCluster(tmp_path / "cluster", 3, network_faults=True)
        with pytest.raises(HostLockBusy, match="the-other-cluster"):
            asyncio.run(cluster.start())
        assert cluster.pid(1) is None

"""Fault scenarios and checks shared by the backend tests (test_local,
test_docker): any :class:`chaos.backend.ClusterBackend` will do."""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.backend import ClusterBackend, isolate
from chaos.netfilter import NetfilterError, require_iptables
from history.export_files import read_changes, read_log
from history.exports import check_changes, check_log
from kqproto import quorum_pb2
from kvstore.client import KvClient
from quorum.driver.client import ClientError, IndeterminateWriteError, describe
from quorum.driver.tls import TlsFiles
from tests.driver.cluster_util import file_serial, served_serial

__all__ = [
    "check_exports",
    "isolate_the_leader",
    "leader",
    "need_iptables",
    "processes_under",
    "put_ms",
    "roles",
    "scratch_tempdir",
    "served_serial",
    "wait_converged",
]


def need_iptables() -> None:
    """Fail, not skip, a test that needs iptables where it is missing: the
    network faults are part of what these tests check."""
    try:
        require_iptables()
    except NetfilterError as exc:
        pytest.fail(f"{exc} (see scripts/bootstrap)")


def scratch_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new folder under ``tmp_path`` made ``tempfile``'s for the test, so
    that what a run leaves in its scratch space can be checked afterwards
    (:func:`processes_under`, an empty folder)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def processes_under(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` (a run's scratch
    folder): what a run left running (zombies and the dead do not count)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(path) in cmdline and state not in ("Z", "X"):
            out.append(f"{pid}: {cmdline}")
    return out


async def roles(cluster: ClusterBackend) -> dict[int, quorum_pb2.DescribeQuorumResponse | None]:
    """Each node's DescribeQuorum answer (None: no answer)."""
    addresses = cluster.addresses()
    answers = await asyncio.gather(
        *(describe(a, 0.5, cluster.client_credentials()) for a in addresses.values())
    )
    return dict(zip(addresses, answers, strict=True))


async def leader(cluster: ClusterBackend, exclude: int | None = None, timeout_s: float = 20) -> int:
    """The node that says it leads, in the highest epoch (not ``exclude``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answers = await roles(cluster)
        leaders = [
            (r.epoch, n)
            for n, r in answers.items()
            if r is not None and r.role == "leader" and n != exclude
        ]
        if leaders:
            return max(leaders)[1]
        assert time.monotonic() < deadline, f"no leader (besides {exclude}): {answers}"
        await asyncio.sleep(0.2)


async def put_ms(cluster: ClusterBackend, puts: int = 7) -> float:
    """The median milliseconds of a put through the leader: its commit
    waits for a follower, so it crosses the links between nodes."""
    addresses = cluster.addresses()
    out = []
    async with KvClient(
        [addresses[await leader(cluster)]], credentials=cluster.client_credentials()
    ) as kv:
        for i in range(puts):
            started = time.monotonic()
            await kv.put(f"p{i}", b"v", timeout_s=10)
            out.append((time.monotonic() - started) * 1000)
    return statistics.median(out)


async def isolate_the_leader(cluster: ClusterBackend) -> tuple[int, int]:
    """Cut the leader off: another is elected, the majority commits
    ``during``, the isolated old leader cannot commit ``isolated`` and still
    answers the test's client.  Returns (old leader, new leader)."""
    addresses = cluster.addresses()
    old = await leader(cluster)
    await cluster.partition(isolate(cluster.nodes, old))
    new = await leader(cluster, exclude=old)
    majority = [addresses[n] for n in cluster.nodes if n != old]
    async with KvClient(majority, credentials=cluster.client_credentials()) as kv:
        await kv.put("during", b"2", timeout_s=10)
    async with KvClient(
        [addresses[old]], timeout_s=3, credentials=cluster.client_credentials()
    ) as kv:
        with pytest.raises((ClientError, IndeterminateWriteError)):
            await kv.put("isolated", b"3", timeout_s=3)
    # The test client is never blocked: the isolated node still answers it.
    assert await describe(addresses[old], 1.0, cluster.client_credentials()) is not None
    assert new != old
    return old, new


async def wait_converged(
    cluster: ClusterBackend, old: int, timeout_s: float = 30
) -> quorum_pb2.DescribeQuorumResponse:
    """Wait until every node answers and agrees on one leader, epoch and
    high watermark; then the isolated old leader ``old`` has the majority's
    write and not its own.  Returns the leader's answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        answers = await roles(cluster)
        up = [r for r in answers.values() if r is not None]
        leaders = [r for r in up if r.role == "leader"]
        if (
            len(up) == len(cluster.nodes)
            and len(leaders) == 1
            and len({(r.epoch, r.leader.leader_id, r.high_watermark) for r in up}) == 1
        ):
            break
        assert time.monotonic() < deadline, f"no convergence after heal: {answers}"
        await asyncio.sleep(0.2)
    async with KvClient([cluster.addresses()[old]], credentials=cluster.client_credentials()) as kv:
        assert (await kv.get("during")).value == b"2"
        assert (await kv.get("isolated")).value is None
    return leaders[0]


def check_exports(run_dir: Path, nodes: list[int], log_says: str = "") -> None:
    """Every node exported a valid, non-empty committed log, valid changes
    (some as follower or leader) and its own log (which says ``log_says``);
    every committed log is a prefix of the longest one."""
    logs = {n: read_log(run_dir / "nodes" / str(n) / "log.jsonl") for n in nodes}
    for n, entries in logs.items():
        assert entries, f"node {n} exported no committed record"
        assert check_log(entries, n) == []
        changes = read_changes(run_dir / "nodes" / str(n) / "changes.jsonl")
        assert check_changes(changes, n) == []
        assert any(c.role in ("follower", "leader") for c in changes)
        text = (run_dir / "logs" / f"node-{n}.log").read_text()
        assert text and log_says in text
    longest = max(logs.values(), key=len)
    for entries in logs.values():
        strip = [(e.offset, e.epoch, e.kind, e.hash) for e in entries]
        assert strip == [(e.offset, e.epoch, e.kind, e.hash) for e in longest][: len(strip)]


async def rotate_while_serving(
    cluster: ClusterBackend, admin: TlsFiles, cert_file: Callable[[int], Path], rounds: int = 3
) -> None:
    """Rotate every node's certificate ``rounds`` times while a client keeps
    writing: every write succeeds, and after each rotation a new connection
    to each node gets the certificate now in its file (a new serial)."""
    addresses = cluster.addresses()
    seen: dict[int, set[int]] = {n: set() for n in cluster.nodes}
    for n in cluster.nodes:
        serial = await asyncio.to_thread(served_serial, addresses[n], admin)
        assert serial == file_serial(cert_file(n))
        seen[n].add(serial)
    stop = asyncio.Event()
    written: list[int] = []

    async def writer() -> None:
        async with KvClient(
            list(addresses.values()), timeout_s=5, credentials=cluster.client_credentials()
        ) as kv:
            i = 0
            while not stop.is_set():
                await kv.put(f"rotation-{i}", b"v", timeout_s=5)
                written.append(i)
                i += 1
                await asyncio.sleep(0.02)

    task = asyncio.create_task(writer())
    try:
        for _ in range(rounds):
            await asyncio.sleep(0.3)
            await cluster.rotate_certs(cluster.nodes)
            for n in cluster.nodes:
                now = file_serial(cert_file(n))
                assert now not in seen[n], "a rotation makes a new serial"
                served = await asyncio.to_thread(served_serial, addresses[n], admin)
                assert served == now, f"node {n} still serves the old certificate"
                seen[n].add(now)
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await task  # a failed write fails the scenario
    assert len(written) > 20, "the cluster kept serving while its certificates rotated"
    # And the nodes still talk to each other: a fresh leader-routed write.
    async with KvClient(list(addresses.values()), credentials=cluster.client_credentials()) as kv:
        await kv.put("after-rotations", b"1", timeout_s=10)

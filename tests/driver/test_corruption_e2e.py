"""Damaged and misplaced data directories, end to end, on real processes.

``kq cluster up`` starts three ``kq controller start`` processes (snapshots
every 50 offsets); keys are written; then, one node at a time while the others
keep serving:

(a) a byte of a node's latest snapshot file is flipped: ``kq cluster start``
    and ``kq controller start --config`` both refuse to start it, exiting
    non-zero and naming the file; restored, the node starts again;
(b) the value of the highest ``log:`` key of a node's RocksDB is overwritten
    with garbage: the node starts, warns on ``kq.storage`` that it dropped the
    damaged tail (naming the base offset), fetches it again from the leader,
    and serves the keys it held;
(c) the quorum-state key is overwritten: the node refuses to start, naming
    the key; restored, it starts;
(d) a node's config points at another node's data directory: it refuses to
    start, naming both node ids, and leaves that directory alone.

At the end every acknowledged key is readable and all three nodes agree on
the state (applied offset and digest).  ``kq cluster down`` runs in a
``finally``; any process this test saw is then killed if still alive (by pid,
checked against its command line).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgpack
import pytest
from rocksdict import Options, Rdict

from kqproto import quorum_pb2
from kvstore.client import KvClient
from quorum.driver.codec import decode_batch
from quorum.driver.rocks import LOG_PREFIX, STATE_KEY
from quorum.driver.tls import TlsFiles
from quorum.types import BatchKind
from server.local_cluster import (
    ClusterState,
    free_base_port,
    load_state,
    process_alive,
    run_kq,
)

# Every node process this test started: pid -> the config path its command
# line names (the marker process_alive checks, so a reused pid is never hit).
_seen: dict[int, str] = {}


def kq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_kq(*args, timeout_s=timeout)


class Local:
    """The local cluster in ``directory``, driven through the command line."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def state(self) -> ClusterState:
        state = load_state(self.dir)
        assert state is not None
        for n in state.nodes:
            if n.pid is not None:
                _seen[n.pid] = str(state.path(n.config))
        return state

    def addresses(self) -> list[str]:
        return [n.address for n in self.state.nodes]

    def node_dir(self, node: int) -> Path:
        return self.dir / f"node-{node}"

    def log_size(self, node: int) -> int:
        path = self.node_dir(node) / "controller.log"
        return path.stat().st_size if path.exists() else 0

    def log_since(self, node: int, offset: int) -> str:
        with (self.node_dir(node) / "controller.log").open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def start(self, node: int) -> subprocess.CompletedProcess[str]:
        done = kq("cluster", "start", str(node), "--dir", str(self.dir), "--timeout", "20")
        self.state  # noqa: B018 - records the new pid
        return done

    def stop(self, node: int) -> None:
        """SIGTERM one node (a leader resigns first) and wait until it is gone."""
        state = self.state
        entry = state.node(node)
        assert entry.pid is not None, f"node {node} is not running"
        marker = str(state.path(entry.config))
        assert process_alive(entry.pid, marker)
        os.kill(entry.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while process_alive(entry.pid, marker):
            assert time.monotonic() < deadline, f"node {node} (pid {entry.pid}) did not stop"
            time.sleep(0.05)

    def latest_snapshot(self, node: int) -> Path:
        files = sorted((self.node_dir(node) / "data" / "snapshots").glob("*.checkpoint"))
        assert files, f"node {node} has no snapshot"
        return files[-1]

    def rocksdb(self, node: int) -> Rdict:
        """The node's RocksDB opened raw, as quorum/driver/rocks.py opens it."""
        return Rdict(str(self.node_dir(node) / "data" / "rocksdb"), Options(raw_mode=True))


# -- the client side ---------------------------------------------------------------

# The cluster's admin certificate (kq cluster up makes a TLS cluster),
# set once the cluster is made.
_client_tls: list[TlsFiles] = []


def _kv(addresses: list[str], timeout_s: float = 5.0) -> KvClient:
    credentials = _client_tls[0].channel_credentials() if _client_tls else None
    return KvClient(addresses, timeout_s=timeout_s, credentials=credentials)


async def _write(addresses: list[str], prefix: str, count: int, acked: dict[str, bytes]) -> None:
    async with _kv(addresses, timeout_s=15.0) as client:
        for i in range(count):
            key, value = f"{prefix}-{i}", f"{prefix} value {i}".encode()
            await client.put(key, value)
            acked[key] = value


async def _read_all(addresses: list[str], acked: dict[str, bytes]) -> None:
    async with _kv(addresses, timeout_s=15.0) as client:
        for key, value in acked.items():
            got = await client.get(key)
            assert got.present and got.value == value, f"acknowledged key {key} lost: {got}"


async def _stale_reads(address: str, keys: dict[str, bytes], timeout_s: float = 15.0) -> None:
    """``address`` itself (not the leader) serves every key: it caught up."""
    deadline = time.monotonic() + timeout_s
    async with _kv([address], timeout_s=2.0) as client:
        for key, value in keys.items():
            while True:
                got = await client.get(key, linearizable=False)
                assert got.node_address == address
                if got.present and got.value == value:
                    break
                assert time.monotonic() < deadline, f"{address} does not serve {key}: {got}"
                await asyncio.sleep(0.05)


async def _converged(addresses: list[str], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with _kv(addresses) as client:
        await client.put("converge-marker", b"x")
        while True:
            views = {}
            for address in addresses:
                try:
                    d = await client.quorum_stub(address).DescribeQuorum(
                        quorum_pb2.DescribeQuorumRequest(), timeout=2
                    )
                    views[address] = (d.applied_offset, d.state_digest)
                except Exception as exc:
                    views[address] = (-1, repr(exc).encode())
            if len(set(views.values())) == 1 and next(iter(views.values()))[0] > 0:
                return
            assert time.monotonic() < deadline, f"nodes disagree: {views}"
            await asyncio.sleep(0.1)


def arun(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 90))


# -- the scenario -----------------------------------------------------------------------


@pytest.mark.slow
def test_damaged_and_misplaced_data_directories(tmp_path: Path) -> None:
    # Resolved: the nodes name their files by resolved paths.
    cluster = Local(tmp_path.resolve() / "cluster")
    try:
        up = kq(
            "cluster", "up", "--dir", str(cluster.dir), "--nodes", "3", "--brokers", "0",
            "--base-port", str(free_base_port(3)),
            "--set", "node.snapshot_every_offsets=50",
        )  # fmt: skip
        cluster.state  # noqa: B018 - records the pids
        assert up.returncode == 0, up.stderr
        tls = cluster.state.client_tls()
        assert tls is not None
        _client_tls[:] = [tls]
        acked: dict[str, bytes] = {}
        arun(_write(cluster.addresses(), "first", 160, acked))
        down = kq("cluster", "down", "--dir", str(cluster.dir))
        assert down.returncode == 0, down.stderr

        _snapshot_flipped(cluster, acked, victim=1)
        _log_tail_garbage(cluster, acked, victim=2)
        _quorum_state_garbage(cluster, acked, victim=3)
        _another_nodes_directory(cluster, acked, victim=1, owner=2)

        arun(_read_all(cluster.addresses(), acked))
        arun(_converged(cluster.addresses()))
    finally:
        kq("cluster", "down", "--dir", str(cluster.dir))
        for pid, marker in _seen.items():
            if process_alive(pid, marker):
                os.kill(pid, signal.SIGKILL)


def _snapshot_flipped(cluster: Local, acked: dict[str, bytes], victim: int) -> None:
    """(a) All nodes are down.  A flipped byte in the victim's latest snapshot:
    it refuses to start; the others start and serve."""
    others = [n for n in (1, 2, 3) if n != victim]
    snapshot = cluster.latest_snapshot(victim)
    original = snapshot.read_bytes()
    damaged = bytearray(original)
    position = len(damaged) // 2  # inside the payload (the header is 38 bytes)
    damaged[position] ^= 0x5A
    snapshot.write_bytes(bytes(damaged))

    for n in others:
        started = cluster.start(n)
        assert started.returncode == 0, started.stderr
    addresses = [cluster.state.node(n).address for n in others]
    arun(_write(addresses, "while-a", 20, acked))

    mark = cluster.log_size(victim)
    refused = cluster.start(victim)
    assert refused.returncode != 0, refused.stdout
    assert str(snapshot) in refused.stderr, refused.stderr
    assert f"node {victim} exited with status 1" in refused.stderr
    log = cluster.log_since(victim, mark)
    assert f"cannot start node {victim}" in log and str(snapshot) in log, log
    assert "CRC-32C" in log, log
    assert cluster.state.node(victim).pid is None

    # The node's own command, in the foreground: the same refusal on stderr.
    direct = kq(
        "controller", "start", "--config", str(cluster.node_dir(victim) / "config.toml"),
        timeout=30,
    )  # fmt: skip
    assert direct.returncode == 1, direct.stderr
    assert str(snapshot) in direct.stderr, direct.stderr
    assert snapshot.read_bytes() == bytes(damaged)  # refused, not "repaired" or removed

    # The other two kept serving throughout.
    arun(_read_all(addresses, acked))

    snapshot.write_bytes(original)
    started = cluster.start(victim)
    assert started.returncode == 0, started.stderr
    arun(_stale_reads(cluster.state.node(victim).address, acked))


def _log_tail_garbage(cluster: Local, acked: dict[str, bytes], victim: int) -> None:
    """(b) Garbage in the victim's last log batch: dropped with a warning,
    fetched again from the leader."""
    recent: dict[str, bytes] = {}
    arun(_write(cluster.addresses(), "before-b", 12, recent))
    acked.update(recent)
    # Wait until the victim holds every one of them, then stop it.
    victim_address = cluster.state.node(victim).address
    arun(_stale_reads(victim_address, recent))
    cluster.stop(victim)

    db = cluster.rocksdb(victim)
    try:
        log_keys = [
            k
            for k in db.keys(from_key=LOG_PREFIX)
            if isinstance(k, bytes) and k.startswith(LOG_PREFIX)
        ]
        assert log_keys, "the victim's log is empty: nothing to damage"
        last = max(log_keys)
        value = db[last]
        assert isinstance(value, bytes)
        held = decode_batch(value, "the test")
        db[last] = b"\xde\xad garbage \xbe\xef" * 4
    finally:
        db.close()
    base = int.from_bytes(last[len(LOG_PREFIX) :], "big")
    assert held.base_offset == base
    lost_keys: dict[str, bytes] = {}
    if held.kind is BatchKind.DATA:
        for record in held.records:
            op = msgpack.unpackb(record)
            if op[0] == "put":
                lost_keys[op[1]] = op[2]
            elif op[0] == "putm":
                lost_keys.update(dict(op[1]))
    # Writes go on while it is down.
    arun(_write(cluster.addresses(), "while-b", 10, acked))

    mark = cluster.log_size(victim)
    started = cluster.start(victim)
    assert started.returncode == 0, started.stderr
    log = cluster.log_since(victim, mark)
    warning = next(
        (line for line in log.splitlines() if "dropped a damaged log tail" in line), None
    )
    assert warning is not None, log
    assert "WARNING kq.storage" in warning, warning
    assert re.search(rf"1 batch\(es\) at base offsets {base};", warning), warning
    assert f"the log now ends at offset {base}." in warning, warning

    # It fetched the dropped batch (and what came after) from the leader.
    for key, value in lost_keys.items():
        assert acked.get(key) == value
    print(f"node {victim} dropped its batch at offset {base} holding {sorted(lost_keys)}")
    arun(_stale_reads(victim_address, {**lost_keys, **acked}))


def _quorum_state_garbage(cluster: Local, acked: dict[str, bytes], victim: int) -> None:
    """(c) Garbage in the victim's quorum state: it refuses to start."""
    cluster.stop(victim)
    db = cluster.rocksdb(victim)
    try:
        original = db[STATE_KEY]
        assert isinstance(original, bytes)
        db[STATE_KEY] = b"not a quorum state"
    finally:
        db.close()

    mark = cluster.log_size(victim)
    refused = cluster.start(victim)
    assert refused.returncode != 0, refused.stdout
    log = cluster.log_since(victim, mark)
    for text in (refused.stderr, log):
        assert "quorum-state" in text and "refusing to start" in text, text
    assert f"cannot start node {victim}" in log, log
    # The others serve meanwhile.
    arun(_write(cluster.addresses(), "while-c", 5, acked))

    db = cluster.rocksdb(victim)
    try:
        db[STATE_KEY] = original
    finally:
        db.close()
    started = cluster.start(victim)
    assert started.returncode == 0, started.stderr
    arun(_stale_reads(cluster.state.node(victim).address, acked))


def _another_nodes_directory(
    cluster: Local, acked: dict[str, bytes], victim: int, owner: int
) -> None:
    """(d) The victim's config names the owner's (live) data directory."""
    cluster.stop(victim)
    config = cluster.node_dir(victim) / "config.toml"
    original = config.read_text()
    assert 'data_dir = "data"' in original, original
    config.write_text(original.replace('data_dir = "data"', f'data_dir = "../node-{owner}/data"'))
    owner_meta = (cluster.node_dir(owner) / "data" / "kq.meta.json").read_bytes()

    mark = cluster.log_size(victim)
    refused = cluster.start(victim)
    assert refused.returncode != 0, refused.stdout
    log = cluster.log_since(victim, mark)
    for text in (refused.stderr, log):
        assert re.search(
            rf"belongs to cluster \S+ node {owner}, not cluster \S+ node {victim}", text
        ), text
        assert "refusing to start" in text, text
    # The owner's directory is untouched and the owner still serves.
    assert (cluster.node_dir(owner) / "data" / "kq.meta.json").read_bytes() == owner_meta
    arun(_stale_reads(cluster.state.node(owner).address, {"while-c-0": acked["while-c-0"]}))
    arun(_write(cluster.addresses(), "while-d", 5, acked))

    config.write_text(original)
    started = cluster.start(victim)
    assert started.returncode == 0, started.stderr
    arun(_stale_reads(cluster.state.node(victim).address, acked))

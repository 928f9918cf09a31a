"""The local backend: each fault takes effect and heals (slow: real processes)."""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from chaos.backend import isolate, partition_pairs
from chaos.local import LocalCluster, node_dscp, node_host
from chaos.netfilter import NetfilterError, require_iptables
from chaos.node_exports import node_changes
from kvstore.client import KvClient
from quorum.driver.client import describe
from server.config import ConfigError, controller_config, load_settings
from tests.chaos.cluster_scenarios import (
    check_exports,
    isolate_the_leader,
    leader,
    need_iptables,
    put_ms,
    rotate_while_serving,
    wait_converged,
)

Scenario = Callable[[LocalCluster], Awaitable[None]]


def _run(
    tmp_path: Path,
    scenario: Scenario,
    *,
    network_faults: bool = False,
    cluster: LocalCluster | None = None,
) -> LocalCluster:
    if cluster is None:
        cluster = LocalCluster(tmp_path / "cluster", 3, network_faults=network_faults)

    async def main() -> None:
        try:
            await cluster.start()
            await asyncio.wait_for(scenario(cluster), 120)
        finally:
            await cluster.stop()

    asyncio.run(main())
    return cluster


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_kill_takes_a_node_down_and_restart_brings_it_back_with_its_data(tmp_path: Path) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        async with KvClient(
            list(cluster.addresses().values()), credentials=cluster.client_credentials()
        ) as kv:
            pos = await kv.put("k", b"v")
        node = 1
        await asyncio.sleep(0.5)  # let node 1 replicate the put
        before = await describe(cluster.addresses()[node], 1.0, cluster.client_credentials())
        assert before is not None and before.log_end_offset > pos.offset
        pid = cluster.pid(node)
        assert pid is not None
        await cluster.kill(node)
        assert _pid_gone(pid)
        assert cluster.pid(node) is None
        assert await describe(cluster.addresses()[node], 0.5, cluster.client_credentials()) is None
        await cluster.restart(node)
        assert cluster.pid(node) not in (None, pid)
        after = await describe(cluster.addresses()[node], 1.0, cluster.client_credentials())
        assert after is not None and after.log_end_offset >= before.log_end_offset
        async with KvClient(
            [cluster.addresses()[node]], credentials=cluster.client_credentials()
        ) as kv:
            assert (await kv.get("k")).value == b"v"

    _run(tmp_path, scenario)


@pytest.mark.slow
def test_pause_stops_answers_and_resume_restores_them(tmp_path: Path) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        address = cluster.addresses()[2]
        assert await describe(address, 1.0, cluster.client_credentials()) is not None
        await cluster.pause(2)
        started = time.monotonic()
        assert await describe(address, 1.0, cluster.client_credentials()) is None
        assert time.monotonic() - started >= 0.9  # timed out, not refused
        await cluster.resume(2)
        assert await describe(address, 2.0, cluster.client_credentials()) is not None

    _run(tmp_path, scenario)


def _our_rules(tag: str) -> list[str]:
    rules = []
    for table in ("filter", "nat"):
        listing = subprocess.run(
            ["iptables", "-w", "-t", table, "-S"], capture_output=True, text=True, check=True
        ).stdout
        rules += [line for line in listing.splitlines() if tag in line]
    return rules


@pytest.mark.slow
def test_isolating_the_leader_elects_another_and_heal_restores_one_cluster(
    tmp_path: Path,
) -> None:
    need_iptables()
    run_dir = tmp_path / "run"

    async def scenario(cluster: LocalCluster) -> None:
        assert _our_rules(cluster._netfilter.tag), "no rules installed"
        async with KvClient(
            list(cluster.addresses().values()), credentials=cluster.client_credentials()
        ) as kv:
            await kv.put("before", b"1")
        old, _ = await isolate_the_leader(cluster)
        await cluster.heal()
        assert (await wait_converged(cluster, old)).epoch > 1
        await cluster.collect(run_dir)

    cluster = _run(tmp_path, scenario, network_faults=True)
    assert _our_rules(cluster._netfilter.tag) == []
    assert cluster._netfilter.leftovers() == []
    assert not cluster.directory.exists()
    check_exports(run_dir, list(cluster.nodes))


@pytest.mark.slow
def test_a_failing_scenario_still_removes_every_rule_and_process(
    tmp_path: Path,
) -> None:
    need_iptables()

    async def scenario(cluster: LocalCluster) -> None:
        node = await leader(cluster)
        await cluster.block(partition_pairs(cluster.nodes, isolate(cluster.nodes, node)))
        assert len(_our_rules(cluster._netfilter.tag)) > 2
        await leader(cluster, exclude=node)
        raise RuntimeError("boom")

    cluster = LocalCluster(tmp_path / "cluster", 3)
    with pytest.raises(RuntimeError, match="boom"):
        _run(tmp_path, scenario, cluster=cluster)
    assert _our_rules(cluster._netfilter.tag) == []
    assert not (tmp_path / "cluster").exists()


def _connect_ms(cluster: LocalCluster, a: int, b: int, timeout_s: float) -> float | None:
    """Milliseconds to open a TCP connection to node b's port as node a
    opens its connections (its DSCP mark, so its source address; the rules
    take it for node a), or None if it does not connect within ``timeout_s``."""
    port = int(cluster.addresses()[b].rpartition(":")[2])
    with socket.socket() as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, node_dscp(a) << 2)
        sock.settimeout(timeout_s)
        started = time.monotonic()
        try:
            sock.connect((node_host(b), port))
        except OSError:
            return None
        return (time.monotonic() - started) * 1000


async def _connects(cluster: LocalCluster, tries: int = 7, timeout_s: float = 3.0) -> list[float]:
    """Connect times node 1 -> node 2 and node 2 -> node 3 (NaN: no connection)."""
    out = []
    for _ in range(tries):
        for a, b in ((1, 2), (2, 3)):
            ms = await asyncio.to_thread(_connect_ms, cluster, a, b, timeout_s)
            out.append(float("nan") if ms is None else ms)
    return out


def _nfqueue_rules(cluster: LocalCluster) -> list[str]:
    return [r for r in _our_rules(cluster._netfilter.tag) if "NFQUEUE" in r]


@pytest.mark.slow
def test_a_packet_fault_delays_and_drops_node_traffic_and_heal_undoes_it_all(
    tmp_path: Path,
) -> None:
    need_iptables()
    delay_ms = 200.0
    measured: dict[str, float] = {}
    delayers: list[int] = []

    async def scenario(cluster: LocalCluster) -> None:
        before = await _connects(cluster)
        assert all(ms == ms for ms in before), f"no fault yet, every connect works: {before}"
        measured["before"] = statistics.median(before)
        measured["put before"] = await put_ms(cluster)

        await cluster.packet(0.0, delay_ms)
        pid = cluster.delayer_pid
        assert pid is not None and len(_nfqueue_rules(cluster)) == 6  # every ordered pair
        delayers.append(pid)
        delayed = await _connects(cluster)
        measured["delayed"] = statistics.median(delayed)
        # A SYN (and a SYN-ACK, marked by the server) waits out the delay;
        # half of it is a bound no scheduling noise can fake.
        assert measured["delayed"] >= measured["before"] + delay_ms / 2, delayed
        # The cluster's commits wait for the slow links ...
        measured["put delayed"] = await put_ms(cluster)
        assert measured["put delayed"] >= measured["put before"] + delay_ms / 2
        # ... while the test's own (unmarked) client is not delayed.
        assert await describe(cluster.addresses()[2], 1.0, cluster.client_credentials()) is not None

        await cluster.heal()
        assert _pid_gone(pid) and cluster.delayer_pid is None
        assert _nfqueue_rules(cluster) == []
        healed = await _connects(cluster)
        measured["healed"] = statistics.median(healed)
        assert measured["healed"] < measured["before"] + delay_ms / 2, healed
        measured["put healed"] = await put_ms(cluster)
        assert measured["put healed"] < measured["put before"] + delay_ms / 2

        # Everything dropped: no connection between nodes, and no delayer
        # runs (no delay asked); after heal, every connection works again.
        await cluster.packet(1.0, 0.0)
        assert cluster.delayer_pid is None and _nfqueue_rules(cluster) == []
        lost = await _connects(cluster, tries=3, timeout_s=0.5)
        assert all(ms != ms for ms in lost), f"a packet got through: {lost}"
        await cluster.heal()
        back = await _connects(cluster)
        assert all(ms == ms for ms in back), f"a connect failed after heal: {back}"
        assert [r for r in _our_rules(cluster._netfilter.tag) if "DROP" in r] == []

        # The cluster works on: one leader that every node agrees on.
        await leader(cluster)

        # A fault still in force when the cluster stops is removed with it.
        await cluster.packet(0.2, 50.0, 20.0)
        assert cluster.delayer_pid is not None and len(_nfqueue_rules(cluster)) == 6
        delayers.append(cluster.delayer_pid)

    cluster = _run(tmp_path, scenario, network_faults=True)
    print(f"median connect times, ms: {measured}")
    assert all(_pid_gone(pid) for pid in delayers) and cluster.delayer_pid is None
    assert _our_rules(cluster._netfilter.tag) == []


def test_a_packet_fault_is_refused_with_bad_numbers_or_without_network_faults(
    tmp_path: Path,
) -> None:
    plain = LocalCluster(tmp_path / "plain", 3, network_faults=False)
    with pytest.raises(RuntimeError, match="network_faults"):
        asyncio.run(plain.packet(0.1, 50))
    for args, message in (((1.5, 0, 0), "drop"), ((0, -1, 0), "delay_ms"), ((0, 1, 1e9), "jitter")):
        with pytest.raises(ValueError, match=message):
            asyncio.run(LocalCluster(tmp_path / "c", 3).packet(*args))


def test_node_dscp_is_a_setting_in_range(tmp_path: Path) -> None:
    base = {"node_id": "1", "cluster_id": "abcdefghijklmnopqrstuv", "data_dir": str(tmp_path)}
    env = {"KQ_" + k.upper(): v for k, v in base.items()} | {"KQ_VOTERS": "1@127.0.0.1:1"}
    assert controller_config(load_settings(None, env)).options.dscp == 0
    assert controller_config(load_settings(None, env | {"KQ_NODE_DSCP": "21"})).options.dscp == 21
    with pytest.raises(ConfigError, match="dscp"):
        controller_config(load_settings(None, env | {"KQ_NODE_DSCP": "64"}))


def test_changes_from_log_lines() -> None:
    start = int(time.mktime((2024, 5, 1, 12, 0, 0, 0, 0, -1))) * 1_000_000_000
    text = "\n".join(
        [
            "2024-05-01 12:00:00,100 INFO kq.node: node 2 is a candidate in epoch 3",
            "2024-05-01 12:00:00,200 INFO kq.node: node 2 elected leader of epoch 3",
            "2024-05-01 12:00:00,250 INFO kq.node: node 1 elected leader of epoch 9",
            "2024-05-01 12:00:01,000 INFO kq.node: node 2 resigned leadership of epoch 3",
            "2024-05-01 12:00:01,100 INFO kq.node: node 2 follows leader 3 in epoch 4",
            "2024-05-01 12:00:02,000 INFO kq.node: node 2 in epoch 5 with no known leader "
            "(unattached)",
            "garbage",
        ]
    )
    changes = node_changes(2, text, start)
    assert [(c.time, c.epoch, c.leader, c.role) for c in changes] == [
        (100_000_000, 3, None, "candidate"),
        (200_000_000, 3, 2, "leader"),
        (1_000_000_000, 3, None, "resigned"),
        (1_100_000_000, 4, 3, "follower"),
        (2_000_000_000, 5, None, "unattached"),
    ]


def test_without_iptables_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("chaos.netfilter._find", lambda: None)
    with pytest.raises(NetfilterError, match="apt-get install iptables"):
        require_iptables()


@pytest.mark.slow
def test_certificates_rotate_while_the_nodes_serve(tmp_path: Path) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        admin = cluster.state.client_tls()
        assert admin is not None and cluster.security_protocol == "SSL"
        certs = cluster.state.certs_dir
        await rotate_while_serving(cluster, admin, lambda n: certs / f"controller-{n}.crt")
        # Each node logged that it took its new certificate, without a restart.
        for n in cluster.state.nodes:
            assert "loaded the changed certificate" in cluster.state.path(n.log_file).read_text()

    _run(tmp_path, scenario)


@pytest.mark.slow
def test_an_insecure_local_cluster_serves_plaintext_and_has_nothing_to_rotate(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", 1, network_faults=False, tls=False)

    async def scenario(cluster: LocalCluster) -> None:
        assert cluster.security_protocol == "PLAINTEXT" and cluster.client_credentials() is None
        assert await describe(cluster.addresses()[1], 1.0) is not None
        with pytest.raises(RuntimeError, match="PLAINTEXT"):
            await cluster.rotate_certs([1])
        log = cluster.state.path(cluster.state.node(1).log_file).read_text()
        assert "listener CONTROLLER" in log and "is PLAINTEXT" in log

    _run(tmp_path, scenario, cluster=cluster)

"""The docker backend: the image is built once, a cluster elects a leader and
serves the host, each fault takes effect and heals, and everything made is
removed (slow: a Docker daemon, an image, containers; the fixtures are in
conftest.py)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from chaos.backend import isolate
from chaos.docker import DockerCluster, netem_available
from chaos.docker_image import Docker, DockerError, ensure_image
from kvstore.client import KvClient
from quorum.driver.client import describe
from tests.chaos.cluster_scenarios import (
    check_exports,
    isolate_the_leader,
    leader,
    put_ms,
    rotate_while_serving,
    wait_converged,
)

Scenario = Callable[[DockerCluster], Awaitable[None]]


def _run(cluster: DockerCluster, scenario: Scenario) -> None:
    async def main() -> None:
        try:
            await asyncio.wait_for(cluster.start(), 300)
            await asyncio.wait_for(scenario(cluster), 180)
        finally:
            await asyncio.wait_for(cluster.stop(), 120)

    asyncio.run(main())


def _leftovers(docker: Docker, cluster: DockerCluster) -> list[str]:
    label = f"label=kq.chaos={cluster.token}"
    out = docker.run("ps", "-aq", "--filter", label).stdout.split()
    out += docker.run("network", "ls", "-q", "--filter", label).stdout.split()
    return out + cluster.netfilter.leftovers()


def _running(docker: Docker, name: str) -> str:
    return docker.run("inspect", "-f", "{{.State.Status}}", name).stdout.strip()


@pytest.mark.slow
def test_the_image_is_built_once_then_taken_from_the_cache(
    docker: Docker, source: Path, image: str
) -> None:
    started = time.monotonic()
    again = ensure_image(docker, source)
    assert again.tag == image and not again.built
    assert time.monotonic() - started < 60
    version = docker.run("run", "--rm", "--network", "none", image, "kq", "version")
    assert version.stdout.strip()


@pytest.mark.slow
def test_a_cluster_serves_the_host_and_each_fault_takes_effect_and_heals(
    docker: Docker, image: str, tmp_path: Path
) -> None:
    cluster = DockerCluster(3, image=image, docker=docker)
    run_dir = tmp_path / "run"

    async def scenario(cluster: DockerCluster) -> None:
        addresses = cluster.addresses()
        async with KvClient(
            list(addresses.values()), credentials=cluster.client_credentials()
        ) as kv:
            await kv.put("k", b"v")
            assert (await kv.get("k")).value == b"v"

        # TLS by default: certificates rotate while the nodes serve the host
        # (each node's files reach it through its mounted folder).
        admin = cluster.state.client_tls()
        assert admin is not None and cluster.security_protocol == "SSL"
        await rotate_while_serving(
            cluster,
            admin,
            lambda n: cluster.state.dir / f"node-{n}" / "certs" / f"controller-{n}.crt",
            2,
        )

        # kill, restart: the node is down, then back with its data.
        name = cluster.containers()[1]
        await asyncio.sleep(0.5)
        await cluster.kill(1)
        assert _running(docker, name) == "exited"
        assert await describe(addresses[1], 0.5, cluster.client_credentials()) is None
        await cluster.restart(1)
        async with KvClient([addresses[1]], credentials=cluster.client_credentials()) as kv:
            assert (await kv.get("k")).value == b"v"

        # pause, resume: no answers (a timeout, not a refusal), then answers.
        await cluster.pause(2)
        assert _running(docker, cluster.containers()[2]) == "paused"
        started = time.monotonic()
        assert await describe(addresses[2], 1.0, cluster.client_credentials()) is None
        assert time.monotonic() - started >= 0.9
        await cluster.resume(2)
        assert await describe(addresses[2], 2.0, cluster.client_credentials()) is not None

        # partition: the isolated leader is replaced, cannot commit, still answers the host.
        old, _ = await isolate_the_leader(cluster)

        # lose: random drops are rules too; heal removes every rule.
        await cluster.lose({(1, 2): 0.25})
        assert any("statistic" in rule for rule in cluster.netfilter.leftovers())
        await cluster.heal()
        assert [r for r in cluster.netfilter.leftovers() if r.startswith("-A KQ-")] == []
        await wait_converged(cluster, old)
        await cluster.collect(run_dir)

    _run(cluster, scenario)
    assert _leftovers(docker, cluster) == []
    check_exports(run_dir, list(cluster.nodes), log_says="starting node")


@pytest.mark.slow
def test_a_failing_scenario_still_removes_every_container_network_and_rule(
    docker: Docker, image: str
) -> None:
    cluster = DockerCluster(3, image=image, docker=docker)

    async def scenario(cluster: DockerCluster) -> None:
        node = await leader(cluster)
        await cluster.pause(node)
        await cluster.partition(isolate(cluster.nodes, node))
        assert len(_leftovers(docker, cluster)) > 4
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _run(cluster, scenario)
    assert _leftovers(docker, cluster) == []
    asyncio.run(cluster.stop())  # twice is fine


@pytest.mark.slow
def test_a_node_that_cannot_start_fails_start_and_leaves_nothing(
    docker: Docker, image: str
) -> None:
    cluster = DockerCluster(3, {"node.dscp": 64}, image=image, docker=docker, start_timeout_s=30)
    with pytest.raises(DockerError, match="(?s)node 1 exited.*dscp"):
        asyncio.run(cluster.start())
    assert _leftovers(docker, cluster) == []


@pytest.mark.slow
def test_a_packet_fault_slows_commits_and_heal_removes_its_rules_and_delayer(
    docker: Docker, image: str
) -> None:
    cluster = DockerCluster(3, image=image, docker=docker)
    delay_ms = 200.0
    measured: dict[str, float] = {}
    delayers: list[int] = []

    def queued() -> list[str]:
        return [r for r in cluster.netfilter.leftovers() if "NFQUEUE" in r]

    async def scenario(cluster: DockerCluster) -> None:
        measured["put before"] = await put_ms(cluster)
        await cluster.packet(0.0, delay_ms)
        pid = cluster.delayer_pid
        if netem_available():
            assert pid is None and queued() == []
        else:
            assert pid is not None and len(queued()) == 6  # every ordered pair
            delayers.append(pid)
        # A commit waits for a follower, across the slow links.
        measured["put delayed"] = await put_ms(cluster)
        assert measured["put delayed"] >= measured["put before"] + delay_ms / 2
        await cluster.heal()
        assert cluster.delayer_pid is None and queued() == []
        measured["put healed"] = await put_ms(cluster)
        assert measured["put healed"] < measured["put before"] + delay_ms / 2
        # Left in force, it goes with the cluster.
        await cluster.packet(0.1, 50.0, 10.0)
        if cluster.delayer_pid is not None:
            delayers.append(cluster.delayer_pid)

    _run(cluster, scenario)
    print(f"median put times, ms: {measured}")
    assert _leftovers(docker, cluster) == []
    assert cluster.delayer_pid is None
    for pid in delayers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_netem_is_refused_naming_the_kernel_module_when_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("chaos.docker.netem_available", lambda: False)
    with pytest.raises(DockerError, match="sch_netem"):
        asyncio.run(DockerCluster(3).netem([1], delay_ms=50))


@pytest.mark.slow
def test_netem_delays_a_node_where_the_kernel_has_it(docker: Docker, image: str) -> None:
    if not netem_available():
        pytest.skip("this kernel has no sch_netem module (netem delay and loss are refused)")
    cluster = DockerCluster(3, image=image, docker=docker)

    async def scenario(cluster: DockerCluster) -> None:
        await cluster.netem([1], delay_ms=200)
        shown = docker.run("exec", cluster.containers()[1], "tc", "qdisc", "show", "dev", "eth0")
        assert "netem" in shown.stdout
        await cluster.heal()

    _run(cluster, scenario)
    assert _leftovers(docker, cluster) == []

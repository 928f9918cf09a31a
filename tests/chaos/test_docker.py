"""The docker backend: the image is built once, a cluster elects a leader and
serves the host, each fault takes effect and heals, and everything made is
removed (slow: a Docker daemon, an image, containers).

Needs root.  Missing tools (docker.io, debootstrap) are installed with
apt-get, and a Docker daemon is started when none answers (and stopped
again at the end if these tests started it).  The kq image these tests
build is removed at the end; the Debian base image is kept as the cache.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from chaos.backend import isolate
from chaos.docker import DockerCluster, netem_available
from chaos.docker_image import (
    Docker,
    DockerError,
    copy_source,
    ensure_daemon,
    ensure_image,
    stop_daemon,
)
from chaos.export_files import read_changes, read_log
from chaos.exports import check_changes, check_log
from kq import kv_pb2
from quorum.driver.cli_common import describe
from quorum.driver.client import ClientError, IndeterminateWriteError, KvClient

Scenario = Callable[[DockerCluster], Awaitable[None]]


def _install_missing_tools() -> None:
    missing = []
    if shutil.which("docker") is None and shutil.which("dockerd") is None:
        missing.append("docker.io")
    if shutil.which("debootstrap") is None and not os.path.exists("/usr/sbin/debootstrap"):
        missing.append("debootstrap")
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(f"the docker tests need {' '.join(missing)} (run scripts/bootstrap as root)")
    print(f"installing {' '.join(missing)} for the docker tests (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (["update", "-qq"], ["install", "-y", "-qq", *missing]):
        subprocess.run(["apt-get", *args], env=env, check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    _install_missing_tools()
    try:
        daemon = ensure_daemon()
    except DockerError as exc:
        pytest.fail(str(exc))
    try:
        yield daemon
    finally:
        stop_daemon(daemon)  # only if these tests started it


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the source tree, still while the tests build from it."""
    copy = tmp_path_factory.mktemp("source") / "kq"
    copy_source(Path(__file__).resolve().parents[2], copy)
    return copy


@pytest.fixture(scope="module")
def image(docker: Docker, source: Path) -> Iterator[str]:
    """The kq image, removed at the end if these tests built it (the base
    image stays: it is the slow part, made once per host)."""
    made = ensure_image(docker, source)
    try:
        yield made.tag
    finally:
        if made.built:
            docker.run("rmi", made.tag, check=False)


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


async def _roles(cluster: DockerCluster) -> dict[int, kv_pb2.DescribeQuorumResponse | None]:
    addresses = cluster.addresses()
    answers = await asyncio.gather(*(describe(a, 0.5) for a in addresses.values()))
    return dict(zip(addresses, answers, strict=True))


async def _leader(cluster: DockerCluster, exclude: int | None = None, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        answers = await _roles(cluster)
        leaders = [
            (r.epoch, n)
            for n, r in answers.items()
            if r is not None and r.role == "leader" and n != exclude
        ]
        if leaders:
            return max(leaders)[1]
        assert time.monotonic() < deadline, f"no leader (besides {exclude}): {answers}"
        await asyncio.sleep(0.2)


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
        async with KvClient(list(addresses.values())) as kv:
            await kv.put("k", b"v")
            assert (await kv.get("k")).value == b"v"

        # kill, restart: the node is down, then back with its data.
        name = cluster.containers()[1]
        await asyncio.sleep(0.5)
        await cluster.kill(1)
        assert _running(docker, name) == "exited"
        assert await describe(addresses[1], 0.5) is None
        await cluster.restart(1)
        async with KvClient([addresses[1]]) as kv:
            assert (await kv.get("k")).value == b"v"

        # pause, resume: no answers (a timeout, not a refusal), then answers.
        await cluster.pause(2)
        assert _running(docker, cluster.containers()[2]) == "paused"
        started = time.monotonic()
        assert await describe(addresses[2], 1.0) is None
        assert time.monotonic() - started >= 0.9
        await cluster.resume(2)
        assert await describe(addresses[2], 2.0) is not None

        # partition: the isolated leader is replaced, cannot commit, still answers the host.
        old = await _leader(cluster)
        await cluster.partition(isolate(cluster.nodes, old))
        new = await _leader(cluster, exclude=old)
        majority = [addresses[n] for n in cluster.nodes if n != old]
        async with KvClient(majority) as kv:
            await kv.put("during", b"2", timeout_s=10)
        async with KvClient([addresses[old]], timeout_s=3) as kv:
            with pytest.raises((ClientError, IndeterminateWriteError)):
                await kv.put("isolated", b"3", timeout_s=3)
        assert await describe(addresses[old], 1.0) is not None

        # lose: random drops are rules too; heal removes every rule.
        await cluster.lose({(1, 2): 0.25})
        assert any("statistic" in rule for rule in cluster.netfilter.leftovers())
        await cluster.heal()
        assert [r for r in cluster.netfilter.leftovers() if r.startswith("-A KQ-")] == []
        deadline = time.monotonic() + 30
        while True:
            answers = await _roles(cluster)
            up = [r for r in answers.values() if r is not None]
            leaders = [r for r in up if r.role == "leader"]
            if (
                len(up) == 3
                and len(leaders) == 1
                and len({(r.epoch, r.leader.leader_id, r.high_watermark) for r in up}) == 1
            ):
                break
            assert time.monotonic() < deadline, f"no convergence after heal: {answers}"
            await asyncio.sleep(0.2)
        assert new != old
        async with KvClient([addresses[old]]) as kv:
            assert (await kv.get("during")).value == b"2"
            assert (await kv.get("isolated")).value is None
        await cluster.collect(run_dir)

    _run(cluster, scenario)
    assert _leftovers(docker, cluster) == []
    logs = {n: read_log(run_dir / "nodes" / str(n) / "log.jsonl") for n in cluster.nodes}
    for n, entries in logs.items():
        assert entries, f"node {n} exported no committed record"
        assert check_log(entries, n) == []
        changes = read_changes(run_dir / "nodes" / str(n) / "changes.jsonl")
        assert check_changes(changes, n) == []
        assert any(c.role in ("follower", "leader") for c in changes)
        assert "starting node" in (run_dir / "logs" / f"node-{n}.log").read_text()
    longest = max(logs.values(), key=len)
    for entries in logs.values():
        strip = [(e.offset, e.epoch, e.kind, e.hash) for e in entries]
        assert strip == [(e.offset, e.epoch, e.kind, e.hash) for e in longest][: len(strip)]


@pytest.mark.slow
def test_a_failing_scenario_still_removes_every_container_network_and_rule(
    docker: Docker, image: str
) -> None:
    cluster = DockerCluster(3, image=image, docker=docker)

    async def scenario(cluster: DockerCluster) -> None:
        leader = await _leader(cluster)
        await cluster.pause(leader)
        await cluster.partition(isolate(cluster.nodes, leader))
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

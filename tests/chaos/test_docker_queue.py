"""The queue workload on the docker backend: 3 controller containers and 3
broker containers on the run's internal network, a short run with kill,
pause and partition faults that may pick any of them, and the final polls.
The run ends valid (every acknowledged record found by the final polls at
its offset), the brokers' partition exports are there and hold those
records, and nothing made is left (slow: a Docker daemon, the image and six
containers; the fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from chaos.backend import ClusterBackend
from chaos.docker import DockerCluster
from chaos.docker_image import Docker
from chaos.runner import BACKENDS, BackendSpec, RunConfig, expand_nemesis, run_chaos
from chaos.workloads.queue_setup import QueueOptions
from history.exports import record_hash
from history.files import read_history
from history.ops import NEMESIS
from history.runs import RunDir, check_run
from tests.chaos.cluster_scenarios import scratch_tempdir
from tests.chaos.queue_runs import check_final_polls_found_everything

pytestmark = pytest.mark.slow


def _leftovers(docker: Docker, cluster: DockerCluster) -> list[str]:
    label = f"label=kq.chaos={cluster.token}"
    out = docker.run("ps", "-aq", "--filter", label).stdout.split()
    out += docker.run("network", "ls", "-q", "--filter", label).stdout.split()
    return out + cluster.netfilter.leftovers()


def _docker_backend(
    monkeypatch: pytest.MonkeyPatch, docker: Docker, image: str
) -> list[DockerCluster]:
    """Runs of the docker backend use the tests' daemon and image; the
    clusters they made."""
    made: list[DockerCluster] = []

    def make(
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
        *,
        env: Mapping[str, str] | None = None,
    ) -> ClusterBackend:
        cluster = DockerCluster(
            nodes,
            image=image,
            docker=docker,
            tls=tls,
            env=env,
            brokers=brokers,
            broker_settings=broker_settings,
        )
        made.append(cluster)
        return cluster

    monkeypatch.setitem(BACKENDS, "docker", BackendSpec(make, "test", brokers=True))
    return made


def test_a_short_docker_queue_run_with_kill_pause_and_partition_ends_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Docker, image: str
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    made = _docker_backend(monkeypatch, docker, image)
    faults = tuple(expand_nemesis(["kill", "pause", "partition"], 6))
    config = RunConfig(
        name="queue-docker",
        backend="docker",
        workload="queue",
        faults=faults,
        time_limit_s=14,
        rate=30,
        concurrency=3,
        # Seed 11's schedule: a bridge partition, broker 5 killed and
        # started again, controller 3 paused.
        seed=11,
        fault_interval_s=2.0,
        fault_period_s=8.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(partitions=2, replication_factor=3, min_isr=2, final_time_s=30),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 420))
    [cluster] = made
    assert _leftovers(docker, cluster) == []
    assert list(scratch.iterdir()) == []
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    run = RunDir(result.path)
    assert check_run(run.path) == []
    cfg = json.loads(run.config.read_text())
    assert cfg["backend"] == "docker" and cfg["brokers"] == [4, 5, 6]

    ops = read_history(run.history)
    done = {op.f for op in ops if op.process == NEMESIS and op.type == "ok"}
    assert {"kill", "start", "pause", "resume", "partition", "heal"} <= done, done
    sends = [op for op in ops if op.f == "send" and op.type == "ok"]
    assert len(sends) >= 10
    check_final_polls_found_everything(run, ops)

    # Every broker's partition exports, copied out of its container: the
    # acknowledged records at their offsets, each partition's HW and its
    # timeline; the controllers' committed partition changes.
    exported: set[tuple[int, int, str]] = set()
    for broker in (4, 5, 6):
        assert "starting broker" in (run.logs / f"broker-{broker}.log").read_text()
        folder = run.node_dir(broker)
        for line in (folder / "partitions.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert rec["node"] == broker and rec["topic"] == "queue"
            exported.add((rec["partition"], rec["offset"], rec["hash"]))
        states = [
            json.loads(x) for x in (folder / "partition_state.jsonl").read_text().splitlines()
        ]
        assert {s["partition"] for s in states} <= {0, 1}
        assert all(0 <= s["high_watermark"] <= s["log_end_offset"] for s in states)
        assert (folder / "partition_timeline.jsonl").read_text()
    for op in sends:
        for _, key, (offset, value) in op.value:
            if offset is not None:
                assert (key, offset, record_hash(str(value).encode())) in exported, (key, offset)
    changes = [
        json.loads(line)
        for line in (run.node_dir(1) / "partition_changes.jsonl").read_text().splitlines()
    ]
    assert {(c["topic"], c["partition"]) for c in changes} == {("queue", p) for p in range(2)}


def test_the_faults_aimed_at_partitions_and_power_loss_run_on_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker: Docker, image: str
) -> None:
    """A partition's leader paused, killed and power-cut (every container in
    the power-loss test mode), and a follower cut off, each found from the
    controllers' metadata: the run ends valid and nothing is left."""
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    made = _docker_backend(monkeypatch, docker, image)
    faults = tuple(
        expand_nemesis(
            [
                "pause-partition-leader",
                "kill-partition-leader",
                "isolate-follower",
                "power-loss-partition-leader",
            ],
            6,
        )
    )
    config = RunConfig(
        name="queue-docker-partitions",
        backend="docker",
        workload="queue",
        faults=faults,
        time_limit_s=16,
        rate=30,
        concurrency=3,
        # Seed 38's schedule has each of the four faults once.
        seed=38,
        fault_interval_s=2.0,
        fault_period_s=8.0,
        quiet_s=2.0,
        runs_dir=str(tmp_path / "runs"),
        queue=QueueOptions(partitions=2, replication_factor=3, min_isr=2, final_time_s=30),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 420))
    [cluster] = made
    assert _leftovers(docker, cluster) == []
    assert list(scratch.iterdir()) == []
    assert result.completed, result.error
    assert result.recovered and result.final_ok, result.final_check
    assert result.problems == []
    run = RunDir(result.path)
    assert check_run(run.path) == []
    ops = read_history(run.history)
    # The nemesis's ops come in turn: each invoke, then its completion.
    nemesis = [op for op in ops if op.process == NEMESIS]
    done = list(zip(nemesis[::2], nemesis[1::2], strict=True))
    assert all(end.type == "ok" for _, end in done), [(a.f, b.type) for a, b in done]
    hit = {(op.f, op.value.get("kind")) for op, _ in done if isinstance(op.value, dict)}
    for f, kind in (
        ("pause", "pause-partition-leader"),
        ("kill", "kill-partition-leader"),
        ("partition", "isolate-follower"),
        ("kill", "power-loss-partition-leader"),
    ):
        assert (f, kind) in hit, (f, kind, hit)
    # Each hit a broker: the partitions' replicas are the brokers.
    targets = {
        n
        for op in ops
        if op.process == NEMESIS
        and op.type == "invoke"
        and op.f in ("kill", "pause")
        and isinstance(op.value, dict)
        for n in op.value.get("nodes", ())
    }
    assert targets and targets <= {4, 5, 6}, targets
    check_final_polls_found_everything(run, ops)
    for broker in (4, 5, 6):
        text = (run.logs / f"broker-{broker}.log").read_text()
        assert "runs in the power-loss test mode" in text, broker
        assert (run.node_dir(broker) / "partitions.jsonl").exists()

"""Run orchestration (chaos.runner): short real runs of the local and the
docker backend with kill, pause and partition faults (and of the local
backend with packet faults), and what a run leaves when it fails (the
docker fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import grpc
import pytest
from pyspark.sql import SparkSession

from chaos import runner
from chaos.backend import ClusterBackend
from chaos.docker import DockerCluster
from chaos.docker_image import Docker
from chaos.local import LocalCluster
from chaos.nemesis import Action
from chaos.runner import BACKENDS, BackendSpec, RunConfig, RunResult, expand_nemesis, run_chaos
from chaos.workloads.register import CONFIG_REGISTER_KEYS
from history.export_files import read_changes, read_log
from history.files import NEMESIS, HistoryWriter, check_well_formed, read_history
from history.runs import RunDir, check_run
from kq.cli import main
from spark_verify.job import VerifyOptions, verify
from tests.chaos.cluster_scenarios import need_iptables, processes_under, scratch_tempdir

# -- names and configs -------------------------------------------------------------


def test_partition_expands_to_the_kinds_the_cluster_size_allows() -> None:
    assert expand_nemesis(["partition", "kill"], 3) == [
        "kill",
        "isolate-one",
        "isolate-leader",
        "halves",
        "bridge",
    ]
    assert "majorities-ring" in expand_nemesis(["partition"], 5)
    assert expand_nemesis(["pause", "pause"], 1) == ["pause"]
    assert expand_nemesis([], 3) == []


@pytest.mark.parametrize(
    ("names", "nodes", "message"),
    [
        (["flood"], 3, "unknown nemesis 'flood'"),
        (["majorities-ring"], 3, "at least 5 nodes"),
        (["partition"], 1, "at least 2 nodes"),
    ],
)
def test_bad_nemesis_names_are_refused(names: list[str], nodes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_nemesis(names, nodes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"backend": "cloud"}, "unknown backend 'cloud'"),
        ({"workload": "bank"}, "unknown workload 'bank'"),
        ({"faults": ("flood",)}, "unknown fault kinds"),
        ({"nodes": 0}, "nodes must be at least 1"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"rate": 0.0}, "rate must be positive"),
        ({"time_limit_s": -1.0}, "time_limit_s must be positive"),
        ({"faults": ("bridge",), "nodes": 2}, "bridge needs at least 3 nodes"),
        ({"store": "etcd"}, "unknown store 'etcd'"),
        ({"keys": 9}, "the configs store has 8 registers; 9 keys asked"),
    ],
)
def test_bad_configs_are_refused_before_anything_is_made(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    config = RunConfig(runs_dir=str(tmp_path / "runs"), **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        asyncio.run(run_chaos(config))
    assert not (tmp_path / "runs").exists()


# -- a failing backend -------------------------------------------------------------


class BrokenBackend:
    """Starts nothing; records that it was stopped."""

    instances: list[BrokenBackend] = []

    def __init__(self, nodes: int) -> None:
        self._nodes = list(range(1, nodes + 1))
        self.stopped = 0
        BrokenBackend.instances.append(self)

    @property
    def nodes(self) -> Sequence[int]:
        return self._nodes

    async def start(self) -> None:
        raise RuntimeError("no cluster today")

    async def stop(self) -> None:
        self.stopped += 1

    async def kill(self, node: int) -> None: ...
    async def restart(self, node: int) -> None: ...
    async def pause(self, node: int) -> None: ...
    async def resume(self, node: int) -> None: ...
    async def partition(self, groups: Sequence[Collection[int]]) -> None: ...
    async def block(self, pairs: Collection[tuple[int, int]]) -> None: ...
    async def packet(self, drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None: ...
    async def heal(self) -> None: ...

    def addresses(self) -> Mapping[int, str]:
        return {}

    @property
    def security_protocol(self) -> str:
        return "PLAINTEXT"

    def client_credentials(self, broker: int | None = None) -> grpc.ChannelCredentials | None:
        return None

    async def rotate_certs(self, nodes: Sequence[int]) -> None: ...

    async def collect(self, run_dir: Path, start_unix_ns: int | None = None) -> None:
        raise AssertionError("a backend that never started has nothing to collect")


def test_a_backend_that_fails_to_start_is_stopped_and_the_run_folder_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        BACKENDS,
        "broken",
        BackendSpec(
            lambda nodes, workdir, network_faults, tls, brokers=0, broker_settings=None: (
                BrokenBackend(nodes)
            ),
            "test",
        ),
    )
    BrokenBackend.instances.clear()
    config = RunConfig(
        name="broken", backend="broken", faults=("kill",), runs_dir=str(tmp_path), seed=1
    )
    result = asyncio.run(run_chaos(config))
    assert not result.completed and not result.ok
    assert result.error == "RuntimeError: no cluster today"
    assert [b.stopped for b in BrokenBackend.instances] == [1]
    run = RunDir(result.path)
    config_json = json.loads(run.config.read_text())
    assert config_json["backend"] == "broken" and config_json["faults"] == ["kill"]
    summary = json.loads(run.summary.read_text())
    assert summary["completed"] is False and "no cluster today" in summary["error"]
    # Nothing was recorded, and a run with faults needs nemesis ops.
    assert read_history(run.history) == []
    assert [p.kind for p in result.problems] == ["nemesis-missing"]
    assert "no cluster today" in (run.logs / "harness.log").read_text()


# -- the nemesis carrying out kills -------------------------------------------------


class RecordingBackend(BrokenBackend):
    """Records the kills, restarts, packet faults and heals it is asked for."""

    def __init__(self, nodes: int) -> None:
        super().__init__(nodes)
        self.calls: list[tuple[str, int]] = []
        self.network: list[tuple[object, ...]] = []

    async def kill(self, node: int) -> None:
        self.calls.append(("kill", node))

    async def restart(self, node: int) -> None:
        self.calls.append(("restart", node))

    async def packet(self, drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None:
        self.network.append(("packet", drop, delay_ms, jitter_ms))

    async def heal(self) -> None:
        self.network.append(("heal",))


def test_the_nemesis_kills_the_leader_and_restarts_that_node_then_a_majority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leaders = iter([2, None])

    async def leader(backend: object, timeout_s: float = 5.0) -> int | None:
        return next(leaders)

    monkeypatch.setattr(runner, "current_leader", leader)
    backend = RecordingBackend(3)
    writer = HistoryWriter(tmp_path / "history.jsonl")
    nemesis = runner._Nemesis(backend, writer, lambda _line: None)
    kill = Action(0, "kill", kind="kill-leader", target="leader")
    start = Action(0, "start", kind="kill-leader", target="leader")
    majority = (1, 3)

    async def go() -> list[str]:
        return [
            (await nemesis.act(kill))[0],
            (await nemesis.act(start))[0],
            (await nemesis.act(kill))[0],  # no leader: skipped
            (await nemesis.act(start))[0],  # nothing killed: skipped
            (await nemesis.act(Action(0, "kill", nodes=majority, kind="kill-majority")))[0],
            (await nemesis.act(Action(0, "start", nodes=majority, kind="kill-majority")))[0],
        ]

    outcomes = asyncio.run(go())
    writer.close()
    assert outcomes == ["ok", "ok", "skipped", "skipped", "ok", "ok"]
    assert backend.calls == [
        ("kill", 2),
        ("restart", 2),
        ("kill", 1),
        ("kill", 3),
        ("restart", 1),
        ("restart", 3),
    ]
    assert nemesis.down == {} and nemesis.killed_leader is None
    assert dict(nemesis.injected) == {"kill-leader": 1, "kill-majority": 1}
    ops = read_history(tmp_path / "history.jsonl")
    assert [(op.f, op.value) for op in ops if op.type == "ok"] == [
        ("kill", {"nodes": [2], "kind": "kill-leader"}),
        ("start", {"nodes": [2], "kind": "kill-leader"}),
        ("kill", {"nodes": [1, 3], "kind": "kill-majority"}),
        ("start", {"nodes": [1, 3], "kind": "kill-majority"}),
    ]
    assert check_well_formed(ops, require_nemesis=True) == []


def test_the_nemesis_carries_out_a_packet_fault_and_records_it_until_heal(
    tmp_path: Path,
) -> None:
    backend = RecordingBackend(3)
    writer = HistoryWriter(tmp_path / "history.jsonl")
    nemesis = runner._Nemesis(backend, writer, lambda _line: None)
    fault = Action(0, "packet", drop=0.2, delay_ms=100, jitter_ms=30)

    async def go() -> list[tuple[str, tuple[str, ...]]]:
        out = [((await nemesis.act(fault))[0], nemesis.faults())]
        return [*out, ((await nemesis.act(Action(0, "heal")))[0], nemesis.faults())]

    assert asyncio.run(go()) == [("ok", ("packet",)), ("ok", ())]
    writer.close()
    assert backend.network == [("packet", 0.2, 100, 30), ("heal",)]
    assert dict(nemesis.injected) == {"packet": 1}
    ops = read_history(tmp_path / "history.jsonl")
    assert [(op.f, op.type, op.value) for op in ops] == [
        ("packet", "invoke", {"drop": 0.2, "duplicate": 0.0, "max_delay_ms": 130}),
        ("packet", "ok", {"drop": 0.2, "duplicate": 0.0, "max_delay_ms": 130}),
        ("heal", "invoke", {}),
        ("heal", "ok", {}),
    ]
    assert check_well_formed(ops, require_nemesis=True) == []
    assert runner._describe_action(fault) == "packet drop 0.2, delay 100±30 ms"


class RotatingBackend(RecordingBackend):
    """Records its rotations; fails the second."""

    async def rotate_certs(self, nodes: Sequence[int]) -> None:
        self.calls.append(("rotate", len(nodes)))
        if len(self.calls) == 2:
            raise RuntimeError("the CA's key is unreadable")


def test_the_nemesis_rotates_certificates_as_an_instant_op(tmp_path: Path) -> None:
    backend = RotatingBackend(3)
    writer = HistoryWriter(tmp_path / "history.jsonl")
    lines: list[str] = []
    nemesis = runner._Nemesis(backend, writer, lines.append)
    rotate = Action(0, "rotate-certs", nodes=(1, 2, 3))

    async def go() -> list[tuple[str, tuple[str, ...]]]:
        return [((await nemesis.act(rotate))[0], nemesis.faults()) for _ in range(2)]

    # Nothing stays in force, even after a rotation that failed.
    assert asyncio.run(go()) == [("ok", ()), ("info", ())]
    writer.close()
    assert backend.calls == [("rotate", 3), ("rotate", 3)]
    assert dict(nemesis.injected) == {"rotate-certs": 2}
    assert "the CA's key is unreadable" in lines[0]
    ops = read_history(tmp_path / "history.jsonl")
    assert [(op.f, op.type, op.value) for op in ops] == [
        ("rotate-certs", "invoke", {"nodes": [1, 2, 3]}),
        ("rotate-certs", "ok", {"nodes": [1, 2, 3]}),
        ("rotate-certs", "invoke", {"nodes": [1, 2, 3]}),
        ("rotate-certs", "info", {"nodes": [1, 2, 3]}),
    ]
    # An instant op: no end is owed.
    assert check_well_formed(ops, require_nemesis=True) == []
    assert nemesis.ends() == [Action(0.0, "heal")]
    assert runner._describe_action(rotate) == "rotate-certs 1,2,3"
    assert expand_nemesis(["rotate-certs", "kill"], 1) == ["kill", "rotate-certs"]


def test_packet_is_named_alone_never_part_of_partition() -> None:
    assert "packet" not in expand_nemesis(["partition", "kill", "pause"], 5)
    assert expand_nemesis(["packet", "kill"], 3) == ["kill", "packet"]
    with pytest.raises(ValueError, match="packet needs at least 2 nodes"):
        expand_nemesis(["packet"], 1)


def test_kill_names_expand_and_kill_majority_needs_three_nodes() -> None:
    assert expand_nemesis(["kill-majority", "kill-leader", "kill"], 3) == [
        "kill",
        "kill-leader",
        "kill-majority",
    ]
    assert "kill-majority" not in expand_nemesis(["kill", "partition"], 5)
    with pytest.raises(ValueError, match="at least 3 nodes"):
        expand_nemesis(["kill-majority"], 2)


# -- a real run --------------------------------------------------------------------------


def _verified(spark: SparkSession, run: Path) -> None:
    """The Spark verification of the run finds it valid under every check."""
    done = verify(spark, [run], VerifyOptions(report=False))
    bad = {n: c for n, c in done.verdict["checks"].items() if c["valid"] is not True}
    assert done.valid is True, json.dumps(bad, indent=1)[:4000]
    assert done.verdict["checks"]["linearizable"]["detail"]["keys"] >= 1


def _check_run_folder(
    result: RunResult,
    faults: tuple[str, ...],
    seed: int,
    store: str = "configs",
    protocol: str = "SSL",
) -> None:
    """The run completed, recovered and left a well-formed run folder with
    nemesis operations and every node's exports."""
    assert result.error is None and result.completed and result.recovered, result.error
    assert result.ok and result.problems == []
    assert check_run(result.path) == []

    run = RunDir(result.path)
    ops = read_history(run.history)
    assert check_well_formed(ops, model="register", require_nemesis=True) == []
    invokes = [op for op in ops if op.type == "invoke"]
    assert len(invokes) * 2 == len(ops), "every invoke has its completion"
    nemesis = [op for op in ops if op.process == NEMESIS]
    assert {op.f for op in nemesis} & {"kill", "pause", "partition", "packet", "rotate-certs"}
    assert nemesis[-1].f == "heal" and nemesis[-1].type == "ok"
    reads = [op for op in ops if op.f == "read" and op.type == "ok"]
    assert reads, "the cluster served linearizable reads"
    # Acknowledged writes name a data record that the nodes committed (a node
    # that took that range from a snapshot has no line for it).
    logs = [{e.offset: (e.epoch, e.kind) for e in read_log(run.node_log(n))} for n in (1, 2, 3)]
    for op in ops:
        if op.type == "ok" and op.f in ("write", "cas"):
            found = {log[op.offset] for log in logs if op.offset in log}
            assert found == {(op.epoch, "data")}, op

    config_json = json.loads(run.config.read_text())
    assert config_json["nodes"] == [1, 2, 3] and config_json["faults"] == list(faults)
    assert config_json["seed"] == seed and f"--seed {seed}" in config_json["replay"]
    assert config_json["store"] == store and f"--store {store}" in config_json["replay"]
    if store == "configs":
        assert set(config_json["keys"]) <= set(CONFIG_REGISTER_KEYS)
    summary = json.loads(run.summary.read_text())
    assert summary["well_formed"] and summary["completed"] and summary["recovered"]
    # TLS by default; the run folder says which protocol the nodes spoke.
    assert config_json["security_protocol"] == summary["security_protocol"] == protocol
    assert ("--insecure" in config_json["replay"]) == (protocol == "PLAINTEXT")
    assert summary["nemesis"] == len(nemesis) // 2
    assert sum(summary["faults_injected"].values()) >= 1
    assert summary["ops"]["invoke"] == len(invokes) - summary["nemesis"]
    for node in (1, 2, 3):
        assert read_log(run.node_log(node)), f"node {node} exported its committed log"
        assert read_changes(run.node_changes(node)), f"node {node} exported its changes"
        assert (run.logs / f"node-{node}.log").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.spark
def test_a_short_local_run_with_every_fault_leaves_a_well_formed_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession
) -> None:
    need_iptables()
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    made: list[LocalCluster] = []
    local = BACKENDS["local"]

    def make(
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
    ) -> ClusterBackend:
        cluster = local.make(nodes, workdir, network_faults, tls, brokers, broker_settings)
        assert isinstance(cluster, LocalCluster)
        made.append(cluster)
        return cluster

    monkeypatch.setitem(BACKENDS, "local", BackendSpec(make, "test"))
    faults = tuple(expand_nemesis(["kill", "pause", "partition", "packet"], 3))
    config = RunConfig(
        name="ci",
        faults=faults,
        time_limit_s=8,
        rate=50,
        concurrency=4,
        keys=3,
        seed=7,
        fault_interval_s=1.0,
        runs_dir=str(tmp_path / "runs"),
    )
    seen: list[str] = []
    result = asyncio.run(
        asyncio.wait_for(run_chaos(config, lambda p: seen.append(p.event or "tick")), 90)
    )
    _check_run_folder(result, faults, seed=7)
    _verified(spark, result.path)
    assert "tick" in seen and any(e.startswith("nemesis ") for e in seen)

    # Nothing is left running, no firewall rule and no scratch data.
    assert processes_under(scratch) == []
    [cluster] = made
    assert cluster._netfilter.leftovers() == []
    assert all(cluster.pid(n) is None for n in cluster.nodes)
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_a_short_local_run_with_packet_faults_leaves_no_rule_or_delayer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    need_iptables()
    made: list[LocalCluster] = []
    local = BACKENDS["local"]
    delayers: list[int] = []

    def make(
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
    ) -> ClusterBackend:
        assert network_faults, "a packet fault needs the network rules"
        cluster = local.make(nodes, workdir, network_faults, tls, brokers, broker_settings)
        assert isinstance(cluster, LocalCluster)
        made.append(cluster)
        packet = cluster.packet

        async def spy(drop: float, delay_ms: float, jitter_ms: float = 0.0) -> None:
            await packet(drop, delay_ms, jitter_ms)
            pid = cluster.delayer_pid
            assert pid is not None, "a delayed packet fault runs a delayer"
            delayers.append(pid)

        cluster.packet = spy  # type: ignore[method-assign]
        return cluster

    monkeypatch.setitem(BACKENDS, "local", BackendSpec(make, "test"))
    runs = tmp_path / "runs"
    args = ["--time-limit", "8", "--rate", "40", "--concurrency", "3", "--keys", "3"]
    args += ["--nemesis", "packet", "--seed", "5", "--runs-dir", str(runs)]
    code = main(["chaos", "run", "--backend", "local", "--name", "ci-packet", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"], out
    result = RunResult(Path(out["path"]), completed=True, recovered=True, summary=out)
    _check_run_folder(result, ("packet",), seed=5)
    ops = read_history(RunDir(result.path).history)
    packets = [op for op in ops if op.process == NEMESIS and op.f == "packet"]
    assert packets and all(op.type in ("invoke", "ok") for op in packets)
    assert all(set(op.value) == {"drop", "duplicate", "max_delay_ms"} for op in packets)
    assert out["faults_injected"] == {"packet": len(packets) // 2}

    [cluster] = made
    assert delayers and all(_pid_gone(pid) for pid in delayers)
    assert cluster.delayer_pid is None
    assert cluster._netfilter.leftovers() == []


def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
@pytest.mark.spark
def test_a_short_docker_run_from_the_command_line_leaves_a_well_formed_run_folder(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    docker: Docker,
    image: str,
    spark: SparkSession,
) -> None:
    scratch = scratch_tempdir(tmp_path, monkeypatch)
    made: list[DockerCluster] = []

    def make(
        nodes: int,
        workdir: Path,
        network_faults: bool,
        tls: bool,
        brokers: int = 0,
        broker_settings: Mapping[str, object] | None = None,
    ) -> ClusterBackend:
        assert tls, "a run is on TLS unless --insecure"
        cluster = DockerCluster(nodes, image=image, docker=docker, tls=tls)
        made.append(cluster)
        return cluster

    monkeypatch.setitem(BACKENDS, "docker", BackendSpec(make, "test"))
    runs = tmp_path / "runs"
    args = ["--time-limit", "8", "--rate", "30", "--concurrency", "3", "--keys", "3"]
    args += ["--nemesis", "kill,pause,partition", "--seed", "11", "--runs-dir", str(runs)]
    args += ["--store", "kv"]
    code = main(["chaos", "run", "--backend", "docker", "--name", "ci-docker", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"], out
    result = RunResult(Path(out["path"]), completed=True, recovered=True, summary=out)
    _check_run_folder(
        result, tuple(expand_nemesis(["kill", "pause", "partition"], 3)), seed=11, store="kv"
    )
    assert json.loads(RunDir(result.path).config.read_text())["backend"] == "docker"
    _verified(spark, result.path)

    # No container, network, firewall rule or scratch data is left.
    [cluster] = made
    label = f"label=kq.chaos={cluster.token}"
    assert docker.run("ps", "-aq", "--filter", label).stdout.split() == []
    assert docker.run("network", "ls", "-q", "--filter", label).stdout.split() == []
    assert cluster.netfilter.leftovers() == []
    assert list(scratch.iterdir()) == []

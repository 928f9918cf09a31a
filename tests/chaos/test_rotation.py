"""Certificate rotation under chaos: the ``rotate-certs`` nemesis, and how
long the clients go without an answer while it is the only fault.

The bound is one election.  A node that lost its leader waits
``fetch_timeout_ms`` before it stands, and an election takes at most twice
``election_timeout_ms`` (the randomised timeout is drawn from
``[election_timeout_ms, 2 * election_timeout_ms)``, KIP-595); on top, a
margin of one second for what is not the cluster's: the register clients'
backoff after a failed attempt and the scheduling of a two-core machine
running three nodes, the workload and the harness.  A rotation should cost
nothing (the nodes keep their connections and take the new certificate on
their next handshake); the bound says it never costs more than one
election.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from chaos.availability import Outage, fault_intervals, longest_outage
from chaos.backend import ClusterBackend
from chaos.local import LocalCluster
from chaos.runner import BACKENDS, BackendSpec, RunConfig, run_chaos
from history.files import NEMESIS, read_history
from history.ops import Op
from history.runs import RunDir
from quorum.config import QuorumConfig
from tests.chaos.cluster_scenarios import scratch_tempdir
from tests.chaos.test_runner import _check_run_folder, _verified

MARGIN_S = 1.0
_DEFAULTS = QuorumConfig()
ONE_ELECTION_S = (_DEFAULTS.fetch_timeout_ms + 2 * _DEFAULTS.election_timeout_ms) / 1000 + MARGIN_S

S = 1_000_000_000  # nanoseconds


def _client(index: int, t: float, type_: str = "ok", process: int = 0) -> list[Op]:
    """A read invoked 10 ms before ``t`` and completed at ``t``."""
    error = None if type_ == "ok" else "unavailable"
    return [
        Op(index, int(t * S) - 10_000_000, "invoke", process, "read", key="k"),
        Op(index + 1, int(t * S), type_, process, "read", key="k", error=error),  # type: ignore[arg-type]
    ]


def _nemesis(index: int, t: float, f: str, value: dict[str, object] | None = None) -> list[Op]:
    v = value if value is not None else {}
    return [
        Op(index, int(t * S), "invoke", NEMESIS, f, value=v),
        Op(index + 1, int(t * S) + 1000, "ok", NEMESIS, f, value=v),
    ]


def _history(*parts: list[Op]) -> list[Op]:
    ops = sorted((op for part in parts for op in part), key=lambda op: op.time)
    return [
        Op(i, op.time, op.type, op.process, op.f, key=op.key, value=op.value, error=op.error)
        for i, op in enumerate(ops)
    ]


def test_the_longest_outage_is_found_and_names_the_rotations_in_it() -> None:
    oks = [_client(0, 0.1 * i) for i in range(1, 21)]  # every 100 ms to 2 s
    late = [_client(0, 4.5), _client(0, 4.6)]  # then nothing until 4.5 s
    ops = _history(*oks, *late, _nemesis(0, 2.2, "rotate-certs", {"nodes": [1, 2, 3]}))
    outage = longest_outage(ops)
    assert outage is not None
    assert outage.start_ns == 2 * S and outage.end_ns == int(4.5 * S)
    assert outage.seconds == pytest.approx(2.5)
    assert outage.instant == (("rotate-certs", 1),)
    # Failed attempts are not answers.
    failing = _history(*oks, _client(0, 3.0, "fail"), *late)
    assert longest_outage(failing) == Outage(2 * S, int(4.5 * S))


def test_a_lasting_fault_excuses_the_outage_it_causes() -> None:
    oks = [_client(0, 0.1 * i) for i in range(1, 21)]
    after = [_client(0, 5.0 + 0.1 * i) for i in range(5)]
    killed = _history(
        *oks,
        *after,
        _nemesis(0, 2.05, "kill", {"nodes": [1]}),
        _nemesis(0, 4.9, "start", {"nodes": [1]}),
    )
    assert fault_intervals(killed) == [(int(2.05 * S), int(4.9 * S) + 1000)]
    outage = longest_outage(killed)
    assert outage is not None and outage.seconds < 0.2, outage
    # A partition lasts until a heal; a pause of one node is not ended by
    # the resume of another.
    parted = _history(
        *oks,
        *after,
        _nemesis(0, 2.05, "partition", {"groups": [[1], [2, 3]]}),
        _nemesis(0, 4.9, "heal"),
    )
    assert longest_outage(parted) == longest_outage(killed)
    wrong = _history(
        *oks,
        *after,
        _nemesis(0, 2.05, "pause", {"nodes": [1]}),
        _nemesis(0, 2.5, "resume", {"nodes": [2]}),
    )
    assert fault_intervals(wrong) == [(int(2.05 * S), int(5.4 * S))]
    # Without the fault, the same gap is an outage.
    bare = _history(*oks, *after)
    outage = longest_outage(bare)
    assert outage is not None and outage.seconds == pytest.approx(3.0)


def test_rotation_needs_tls() -> None:
    with pytest.raises(ValueError, match="rotate-certs needs TLS"):
        RunConfig(faults=("rotate-certs",), tls=False).check()
    RunConfig(faults=("rotate-certs",)).check()


@pytest.mark.slow
@pytest.mark.spark
def test_a_local_run_rotating_certificates_stays_available_and_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: SparkSession
) -> None:
    scratch_tempdir(tmp_path, monkeypatch)
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
        assert tls and not network_faults
        cluster = local.make(nodes, workdir, network_faults, tls, brokers, broker_settings)
        assert isinstance(cluster, LocalCluster)
        made.append(cluster)
        return cluster

    monkeypatch.setitem(BACKENDS, "local", BackendSpec(make, "test"))
    config = RunConfig(
        name="ci-rotate",
        faults=("rotate-certs",),
        time_limit_s=10,
        rate=50,
        concurrency=4,
        keys=3,
        seed=13,
        fault_interval_s=0.8,
        fault_period_s=4.0,
        quiet_s=1.0,
        runs_dir=str(tmp_path / "runs"),
    )
    result = asyncio.run(asyncio.wait_for(run_chaos(config), 120))
    _check_run_folder(result, ("rotate-certs",), seed=13)
    _verified(spark, result.path)

    run = RunDir(result.path)
    ops = read_history(run.history)
    rotations = [op for op in ops if op.process == NEMESIS and op.f == "rotate-certs"]
    assert len(rotations) >= 8 and all(op.value == {"nodes": [1, 2, 3]} for op in rotations)
    assert all(op.type in ("invoke", "ok") for op in rotations)
    summary = json.loads(run.summary.read_text())
    assert summary["faults_injected"] == {"rotate-certs": len(rotations) // 2}
    # The nodes took the new certificates while they ran.
    for node in (1, 2, 3):
        log = (run.logs / f"node-{node}.log").read_text()
        assert "loaded the changed certificate" in log, f"node {node} never reloaded"
    # Rotations are the only faults: no stretch without an answer is longer
    # than one election.
    outage = longest_outage(ops)
    assert outage is not None
    print(f"longest stretch without an answer: {outage.seconds:.3f} s (bound {ONE_ELECTION_S} s)")
    assert outage.seconds <= ONE_ELECTION_S, (outage, ONE_ELECTION_S)

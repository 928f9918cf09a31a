"""One short real queue run with torn power losses on the local backend: one
controller and three brokers in the power-loss test mode with torn writes,
acks=all, replication factor 3, min ISR 2; partition leaders lose power and
come back with a torn part of their unsynced segment tails.  The brokers
log each tear and what recovery cut; a correct build loses nothing: the run
ends valid, every acknowledged record found at its offset, and no partition
check fires (no replica keeps a damaged batch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaos.runner import RunConfig
from chaos.workloads.queue_setup import QueueOptions
from history.partition_checks import check_partitions, read_partition_exports
from tests.chaos.power_loss_runs import run_with_power_losses

pytestmark = pytest.mark.slow

_TORN = re.compile(
    r"broker (\d+) torn tail of (\S+): kept (\d+) of (\d+) unsynced bytes from position (\d+)"
)
_RECOVERED = re.compile(r"broker (\d+) partition (\S+) recovered after an unclean shutdown")


def test_torn_power_losses_of_partition_leaders_lose_no_acknowledged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RunConfig(
        name="queue-torn",
        workload="queue",
        faults=("torn-power-loss-partition-leader",),
        nodes=1,
        time_limit_s=20,
        rate=50,
        concurrency=4,
        seed=17,
        fault_interval_s=2.0,
        fault_period_s=12.0,
        quiet_s=2.0,
        queue=QueueOptions(
            brokers=3, partitions=2, replication_factor=3, min_isr=2, acks="all", final_time_s=30
        ),
    )
    # Valid, recovered, every acknowledged record found at its offset by the
    # final polls, nothing left behind (power_loss_runs).
    done = run_with_power_losses(tmp_path, monkeypatch, config)
    run, cuts = done.run, done.cuts
    harness = (run.logs / "harness.log").read_text()
    assert "the nodes run in the power-loss test mode with torn writes" in harness
    brokers = "".join(p.read_text() for p in run.logs.glob("broker-*.log"))
    # Each power loss found unsynced bytes to tear (a leader appends all the
    # time and a short run never rolls a segment), and recovery cut what the
    # tear left damaged.
    tears = _TORN.findall(brokers)
    assert len(tears) >= len(cuts), tears
    assert all(int(kept) <= int(unsynced) for _, _, kept, unsynced, _ in tears)
    assert any(int(kept) > 0 for _, _, kept, _, _ in tears), tears
    assert _RECOVERED.search(brokers), "no recovery cut a torn tail"
    # No replica kept a damaged batch, or differs from the others.
    found = check_partitions(read_partition_exports(run.path))
    assert {check: anomalies for check, anomalies in found.items() if anomalies} == {}

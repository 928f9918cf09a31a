"""Prometheus metrics of a running node."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

from kvstore.client import KvClient
from quorum.driver.metrics import NodeMetrics
from tests.driver.cluster_util import free_ports, run, running


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


def test_metrics_follow_the_quorum(tmp_path: Path) -> None:
    async def go() -> None:
        async with running(tmp_path) as cluster:
            leader = await cluster.wait_leader()
            async with KvClient([leader.config.address]) as client:
                for i in range(10):
                    await client.put("k", b"%d" % i)
            # Gauges are refreshed at most every 100 ms (and on leader
            # changes); the long poll keeps Readies coming while idle.
            await cluster.wait_for(
                lambda: (
                    _value(
                        generate_latest(leader.metrics.registry).decode(),
                        "kq_quorum_high_watermark",
                    )
                    >= 11
                ),
                timeout_s=3,
            )
            text = generate_latest(leader.metrics.registry).decode()
            assert _value(text, "kq_quorum_epoch") == leader.node.core.epoch
            assert _value(text, "kq_quorum_leader_id") == leader.config.node_id
            assert _value(text, "kq_quorum_high_watermark") >= 11
            assert _value(text, "kq_quorum_appended_records_total") >= 10
            assert _value(text, "kq_quorum_commit_latency_seconds_count") == 10
            assert _value(text, "kq_quorum_fsyncs_total") >= 1
            assert _value(text, "kq_quorum_leader_elections_won_total") == 1
            node = leader.config.node_id
            assert f'kq_quorum_role{{node="{node}",role="leader"}} 1.0' in text
            assert "kq_quorum_fetch_lag_records" in text

    run(go())


def test_exporter_serves_http() -> None:
    metrics = NodeMetrics(7)
    metrics.epoch.set(3)
    (port,) = free_ports(1)
    metrics.serve(f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'kq_quorum_epoch{node="7"} 3.0' in text
    finally:
        metrics.close()

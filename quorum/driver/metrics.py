"""Prometheus metrics of one quorum node.

Each node has its own registry (several nodes may share a process in tests)
and, when ``metrics_listen`` is configured, its own HTTP exporter.

- ``kq_quorum_epoch``, ``kq_quorum_leader_id`` (-1: none), ``kq_quorum_role``
  (one label per role, 1 for the current one), ``kq_quorum_high_watermark``,
  ``kq_quorum_log_end_offset``, ``kq_quorum_log_start_offset``;
- ``kq_quorum_commit_latency_seconds``: from a proposal's arrival to its
  commit and apply on the leader (histogram);
- ``kq_quorum_appended_records_total``, ``kq_quorum_appended_batches_total``,
  ``kq_quorum_fsyncs_total``;
- ``kq_quorum_elections_total``: epochs this node saw begin;
  ``kq_quorum_leader_elections_won_total``;
- ``kq_quorum_fetch_lag_records{replica}`` and
  ``kq_quorum_last_fetch_age_seconds{replica}`` on the leader.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from quorum.core import Status
from quorum.ready import Ready
from quorum.types import Role

__all__ = ["NodeMetrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0,
)  # fmt: skip


class NodeMetrics:
    def __init__(self, node_id: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        labels = {"node": str(node_id)}
        self._labels = labels
        self.epoch = Gauge("kq_quorum_epoch", "Current epoch.", ["node"], registry=r).labels(
            **labels
        )
        self.leader = Gauge(
            "kq_quorum_leader_id", "Known live leader, -1 if none.", ["node"], registry=r
        ).labels(**labels)
        self._role = Gauge(
            "kq_quorum_role", "1 for the current role.", ["node", "role"], registry=r
        )
        self.high_watermark = Gauge(
            "kq_quorum_high_watermark", "Committed offset.", ["node"], registry=r
        ).labels(**labels)
        self.log_end = Gauge(
            "kq_quorum_log_end_offset", "Log end offset.", ["node"], registry=r
        ).labels(**labels)
        self.log_start = Gauge(
            "kq_quorum_log_start_offset", "Log start offset.", ["node"], registry=r
        ).labels(**labels)
        self.commit_latency = Histogram(
            "kq_quorum_commit_latency_seconds",
            "Proposal arrival to commit and apply, on the leader.",
            ["node"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        ).labels(**labels)
        self.appended_records = Counter(
            "kq_quorum_appended_records",
            "Records appended by this node as leader.",
            ["node"],
            registry=r,
        ).labels(**labels)
        self.appended_batches = Counter(
            "kq_quorum_appended_batches",
            "Batches appended by this node as leader.",
            ["node"],
            registry=r,
        ).labels(**labels)
        self.fsyncs = Counter(
            "kq_quorum_fsyncs", "Synced writes of the log and quorum state.", ["node"], registry=r
        ).labels(**labels)
        self.elections = Counter(
            "kq_quorum_elections", "Epochs this node saw begin.", ["node"], registry=r
        ).labels(**labels)
        self.won = Counter(
            "kq_quorum_leader_elections_won", "Epochs this node led.", ["node"], registry=r
        ).labels(**labels)
        self.fetch_lag = Gauge(
            "kq_quorum_fetch_lag_records",
            "Leader's log end offset minus the replica's (on the leader).",
            ["node", "replica"],
            registry=r,
        )
        self.fetch_age = Gauge(
            "kq_quorum_last_fetch_age_seconds",
            "Time since the replica last fetched (on the leader).",
            ["node", "replica"],
            registry=r,
        )
        self._last_epoch = 0
        self._led_epoch = 0
        self._server: Any = None

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._server, _ = start_http_server(int(port), host or "127.0.0.1", registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe_ready(self, ready: Ready) -> None:
        if ready.must_sync:
            self.fsyncs.inc()

    def observe_status(self, status: Status, now_ms: int) -> None:
        if status.epoch > self._last_epoch:
            self.elections.inc(status.epoch - self._last_epoch if self._last_epoch else 1)
            self._last_epoch = status.epoch
        if status.role is Role.LEADER and self._led_epoch != status.epoch:
            self.won.inc()
            self._led_epoch = status.epoch
        self.epoch.set(status.epoch)
        live = status.role in (Role.LEADER, Role.FOLLOWER)
        self.leader.set(status.leader_id if live and status.leader_id is not None else -1)
        for role in Role:
            self._role.labels(node=self._labels["node"], role=role.value).set(
                1 if role is status.role else 0
            )
        self.high_watermark.set(status.high_watermark)
        self.log_end.set(status.log_end_offset)
        self.log_start.set(status.log_start_offset)
        for replica in status.replicas:
            if replica.node_id == status.node_id:
                continue
            labels = {"node": self._labels["node"], "replica": str(replica.node_id)}
            self.fetch_lag.labels(**labels).set(
                max(0, status.log_end_offset - replica.log_end_offset)
            )
            if replica.last_fetch_ms is not None:
                self.fetch_age.labels(**labels).set(max(0, now_ms - replica.last_fetch_ms) / 1000)

"""Prometheus metrics of a broker's data plane: the
:class:`broker.metrics.BrokerMetrics` the broker process gives its replica
manager and service, in the node's registry beside the quorum's metrics
(docs/brokers.md has the table, with Kafka's MBean for each).

Counters for what happens (Prometheus computes rates from them: Kafka's
``...PerSec`` meters), a histogram per request kind for the time from a
request's arrival to its answer (Kafka's ``TotalTimeMs``), and gauges read
when scraped for what is in progress (:meth:`PrometheusBrokerMetrics.track`:
requests being handled and operations parked in the purgatory).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.errors import Errors
from broker.group_coordinator import GroupCoordinator
from broker.metrics import RequestKind, is_failure
from broker.purgatory import Operation
from broker.replica.leader import ChangeKind
from broker.service import BrokerService

__all__ = ["LATENCY_BUCKETS", "PrometheusBrokerMetrics"]


def _count(coordinator: GroupCoordinator, state: str) -> float:
    return float(coordinator.group_counts().get(state, 0))


class _GroupLag(Collector):
    """``kq_broker_group_lag``: one series per (group, topic, partition)
    committed at a coordinator here, read when scraped (the series come and
    go with groups and their commits, so no fixed ``Gauge`` children)."""

    def __init__(self, node: str, coordinator: GroupCoordinator) -> None:
        self.node = node
        self.coordinator = coordinator

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kq_broker_group_lag",
            "Records between a group's committed offset and the partition's high watermark, "
            "for the groups coordinated here and the partitions with a replica here.",
            labels=["node", "group", "topic", "partition"],
        )
        for group, topic, partition, lag in self.coordinator.lags():
            family.add_metric([self.node, group, topic, str(partition)], lag)
        yield family


# From 0.5 ms to 10 s: a produce to the local log, an acks=all produce a
# follower fetch away, and a long poll up to its max wait all fall in a
# bucket of their own.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class PrometheusBrokerMetrics:
    """The broker's data-plane metrics in a registry of their own (which the
    process adds to its node's), labelled with its ``node`` id."""

    def __init__(self, node_id: int) -> None:
        self.registry = CollectorRegistry()
        self.node = str(node_id)
        r, node = self.registry, self.node

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["node"], registry=r).labels(node=node)

        self._shrinks = counter(
            "kq_broker_isr_shrinks", "ISR shrinks committed for partitions led here."
        )
        self._expands = counter(
            "kq_broker_isr_expands", "ISR expansions committed for partitions led here."
        )
        self._bytes_in = counter(
            "kq_broker_bytes_in", "Bytes of producers' batches appended to leaders' logs."
        )
        self._messages_in = counter(
            "kq_broker_messages_in", "Records of producers' batches appended to leaders' logs."
        )
        self._bytes_out = counter("kq_broker_bytes_out", "Bytes of records answered to consumers.")
        self._replication_bytes_in = counter(
            "kq_broker_replication_bytes_in", "Bytes a follower appended from its leaders."
        )
        self._replication_bytes_out = counter(
            "kq_broker_replication_bytes_out", "Bytes of records answered to followers."
        )
        self._produces = counter(
            "kq_broker_produce_partitions", "Partitions of produce requests answered."
        )
        self._failed_produces = counter(
            "kq_broker_failed_produce_partitions",
            "Partitions of produce requests that failed (not a stale client's error).",
        )
        self._fetches = counter(
            "kq_broker_fetch_partitions", "Partitions of fetch requests answered."
        )
        self._failed_fetches = counter(
            "kq_broker_failed_fetch_partitions",
            "Partitions of fetch requests that failed (not a stale client's error).",
        )
        self._requests = Counter(
            "kq_broker_requests",
            "Requests answered, by kind.",
            ["node", "request"],
            registry=r,
        )
        self._errors = Counter(
            "kq_broker_request_errors",
            "Error codes answered (the top-level error, else each partition's), by kind.",
            ["node", "request", "error"],
            registry=r,
        )
        self._latency = Histogram(
            "kq_broker_request_latency_seconds",
            "From a request's arrival to its answer, by kind.",
            ["node", "request"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._in_flight = Gauge(
            "kq_broker_requests_in_flight",
            "Requests being handled now, by kind.",
            ["node", "request"],
            registry=r,
        )
        self._purgatory_size = Gauge(
            "kq_broker_purgatory_size",
            "Watches of delayed operations (an operation watches each of its partitions).",
            ["node", "operation"],
            registry=r,
        )
        self._delayed = Gauge(
            "kq_broker_delayed_operations",
            "Operations waiting in the purgatory.",
            ["node", "operation"],
            registry=r,
        )
        self._rebalances = counter(
            "kq_broker_group_rebalances",
            "Group epochs bumped by the group coordinators here (KIP-848: each is a rebalance).",
        )
        self._commit_latency = Histogram(
            "kq_broker_group_commit_latency_seconds",
            "From an OffsetCommit's arrival at its coordinator to its answer (the records "
            "below the offsets partition's high watermark).",
            ["node"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(node=node)
        self._commit_errors = Counter(
            "kq_broker_group_commits",
            "OffsetCommits answered by the group coordinators here, by error code.",
            ["node", "error"],
            registry=r,
        )
        self._groups = Gauge(
            "kq_broker_groups",
            "Groups coordinated here, by state (Empty, Assigning, Reconciling, Stable).",
            ["node", "state"],
            registry=r,
        )
        # Every series exists from the start (a rate needs a first sample),
        # each kind's bound once: labels() is a lock and a lookup, paid here
        # rather than on every request answered.
        self._by_kind = {
            kind: (
                self._requests.labels(node=node, request=kind.value),
                self._latency.labels(node=node, request=kind.value),
            )
            for kind in RequestKind
        }

    # -- BrokerMetrics --------------------------------------------------------------

    def isr_changed(self, kind: ChangeKind) -> None:
        (self._shrinks if kind is ChangeKind.SHRINK else self._expands).inc()

    def appended(self, size: int, records: int) -> None:
        self._bytes_in.inc(size)
        self._messages_in.inc(records)

    def replicated(self, size: int) -> None:
        self._replication_bytes_in.inc(size)

    def answered(
        self,
        request: RequestKind,
        seconds: float,
        error: Errors,
        partitions: Sequence[Errors],
        records_size: int,
    ) -> None:
        requests, latency = self._by_kind[request]
        requests.inc()
        latency.observe(seconds)
        # Per distinct code, not per partition: a replica fetch carries
        # every partition the follower has from this leader.
        by_code = Tally(partitions)
        for code, count in (by_code if error is Errors.NONE else {error: 1}).items():
            self._errors.labels(node=self.node, request=request.value, error=code.name).inc(count)
        total, failed = (
            (self._produces, self._failed_produces)
            if request is RequestKind.PRODUCE
            else (self._fetches, self._failed_fetches)
        )
        total.inc(len(partitions))
        failed.inc(sum(count for code, count in by_code.items() if is_failure(request, code)))
        if request is RequestKind.FETCH:
            self._bytes_out.inc(records_size)
        elif request is RequestKind.FETCH_FOLLOWER:
            self._replication_bytes_out.inc(records_size)

    # -- GroupMetrics ---------------------------------------------------------------

    def rebalanced(self, count: int) -> None:
        self._rebalances.inc(count)

    def commit_answered(self, seconds: float, error: Errors) -> None:
        self._commit_latency.observe(seconds)
        self._commit_errors.labels(node=self.node, error=error.name).inc()

    # -- gauges ---------------------------------------------------------------------

    def track_groups(self, coordinator: GroupCoordinator) -> None:
        """Read the coordinator's groups by state, and their lag, when scraped."""
        for state in ("Empty", "Assigning", "Reconciling", "Stable"):
            self._groups.labels(node=self.node, state=state).set_function(
                partial(_count, coordinator, state)
            )
        self.registry.register(_GroupLag(self.node, coordinator))

    def track(self, service: BrokerService) -> None:
        """Read ``service``'s requests in flight and its purgatory when scraped."""
        for kind in RequestKind:
            self._in_flight.labels(node=self.node, request=kind.value).set_function(
                partial(service.in_flight.__getitem__, kind)
            )
        for operation in Operation:
            labels = {"node": self.node, "operation": operation.value}
            self._purgatory_size.labels(**labels).set_function(
                partial(service.purgatory.watched, operation)
            )
            self._delayed.labels(**labels).set_function(
                partial(service.purgatory.delayed, operation)
            )

    # -- reading (tests, status) ----------------------------------------------------

    def value(self, name: str, **labels: str) -> float:
        """A sample of this node's metrics, 0 if it has none yet."""
        found = self.registry.get_sample_value(name, {"node": self.node, **labels})
        return 0.0 if found is None else float(found)

"""Prometheus metrics of a controller (Kafka's controller metrics, KIP-835).

Registered in the node's registry (:class:`quorum.driver.metrics.NodeMetrics`)
and computed when scraped, from the committed image; the counts that need a
pass over every partition are computed once per image.

- ``kq_controller_active``: 1 on the active controller (Kafka's
  ActiveControllerCount);
- ``kq_controller_registered_brokers``, ``kq_controller_fenced_brokers``,
  ``kq_controller_shutting_down_brokers``;
- ``kq_controller_topics``, ``kq_controller_partitions``,
  ``kq_controller_offline_partitions`` (no leader),
  ``kq_controller_preferred_replica_imbalance`` (partitions not led by their
  preferred replica), ``kq_controller_reassigning_partitions``;
- ``kq_controller_metadata_offset``: end offset of the applied metadata
  (Kafka's LastAppliedRecordOffset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from metadata.image import MetadataImage

__all__ = ["ControllerMetrics", "PartitionCounts"]


@dataclass(frozen=True, slots=True)
class PartitionCounts:
    partitions: int
    offline: int
    imbalanced: int
    reassigning: int

    @classmethod
    def of(cls, image: MetadataImage) -> PartitionCounts:
        partitions = offline = imbalanced = reassigning = 0
        for _, _, p in image.partitions():
            partitions += 1
            offline += not p.has_leader
            imbalanced += p.has_leader and p.leader != p.preferred_leader
            reassigning += p.is_reassigning
        return cls(partitions, offline, imbalanced, reassigning)


class ControllerMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        node_id: int,
        image: Callable[[], MetadataImage],
        is_active: Callable[[], bool],
    ) -> None:
        self._image = image
        self._counted: tuple[MetadataImage, PartitionCounts] | None = None
        node = str(node_id)

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(name, doc, ["node"], registry=registry).labels(node=node).set_function(value)

        gauge("kq_controller_active", "1 on the active controller.", lambda: int(is_active()))
        gauge(
            "kq_controller_registered_brokers",
            "Registered brokers.",
            lambda: len(self._image().brokers),
        )
        gauge(
            "kq_controller_fenced_brokers",
            "Registered brokers that are fenced.",
            lambda: sum(b.fenced for b in self._image().brokers.values()),
        )
        gauge(
            "kq_controller_shutting_down_brokers",
            "Brokers in controlled shutdown.",
            lambda: sum(b.in_controlled_shutdown for b in self._image().brokers.values()),
        )
        gauge("kq_controller_topics", "Topics.", lambda: len(self._image().topics))
        gauge("kq_controller_partitions", "Partitions.", lambda: self.counts().partitions)
        gauge(
            "kq_controller_offline_partitions",
            "Partitions without a leader.",
            lambda: self.counts().offline,
        )
        gauge(
            "kq_controller_preferred_replica_imbalance",
            "Partitions led by another replica than their preferred one.",
            lambda: self.counts().imbalanced,
        )
        gauge(
            "kq_controller_reassigning_partitions",
            "Partitions being reassigned.",
            lambda: self.counts().reassigning,
        )
        gauge(
            "kq_controller_metadata_offset",
            "End offset of the applied metadata.",
            lambda: self._image().offset,
        )

    def counts(self) -> PartitionCounts:
        image = self._image()
        if self._counted is None or self._counted[0] is not image:
            self._counted = (image, PartitionCounts.of(image))
        return self._counted[1]

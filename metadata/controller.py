"""The active controller's decisions (Kafka's QuorumController and its
control managers, KIP-631/KIP-841).

Every handler reads the controller's current image and returns a
:class:`ControllerResult`: the records to write and the response.  It
changes nothing.  The image changes only by replaying records: the
committed image by the state machine, and on the active controller a
speculative image, the committed one plus the records this controller has
written but not yet seen committed, so that one decision sees the ones
before it (Kafka's timeline data structures).  When leadership is lost the
speculative image is dropped and the committed one taken again.

:class:`Controller` is the facade; as in Kafka, the decisions are split
among control managers that share one :class:`ControlState`:
:mod:`metadata.cluster_control` (brokers), :mod:`metadata.replication_control`
(topics, partitions, leaders, ISRs, reassignments),
:mod:`metadata.config_control` (configs), :mod:`metadata.feature_control`
(feature levels, producer ids) and :mod:`metadata.acl_control` (ACLs).  The
requests and results they take and give are :mod:`metadata.requests` (re-exported here).

Heartbeat sessions are soft state (:mod:`metadata.heartbeats`).  Time
enters as ``now_ms``; randomness (topic ids, placement) from an injected
``random.Random``.  No I/O: the asyncio glue is :mod:`metadata.active`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from metadata.acl_control import AclControl
from metadata.acls import AclBindingFilter, StandardAcl
from metadata.cluster_control import ClusterControl
from metadata.config_control import ConfigControl
from metadata.configs import ResourceType
from metadata.control_state import ControlState
from metadata.delta import MetadataDelta
from metadata.errors import ApiError
from metadata.feature_control import FeatureControl
from metadata.heartbeats import HeartbeatManager
from metadata.image import MetadataImage, PartitionRegistration
from metadata.partition_change import Election
from metadata.records import NoOpRecord, Record
from metadata.replication_control import ReplicationControl
from metadata.requests import (
    MAX_TOPIC_NAME,
    METADATA_VERSION,
    PRODUCER_ID_BLOCK,
    SUPPORTED_FEATURES,
    AlterConfigOp,
    AlterPartitionItem,
    ControllerOptions,
    ControllerResult,
    HeartbeatRequest,
    HeartbeatResponse,
    ItemResult,
    NewTopic,
    RegisterRequest,
    items_ok,
)

__all__ = [
    "MAX_TOPIC_NAME",
    "METADATA_VERSION",
    "PRODUCER_ID_BLOCK",
    "SUPPORTED_FEATURES",
    "AlterConfigOp",
    "AlterPartitionItem",
    "Controller",
    "ControllerOptions",
    "ControllerResult",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "ItemResult",
    "NewTopic",
    "RegisterRequest",
    "items_ok",
]


class Controller:
    """The decisions of the active controller, on its speculative image."""

    def __init__(self, options: ControllerOptions, rng: random.Random) -> None:
        self.state = ControlState(options, rng)
        self.replication = ReplicationControl(self.state)
        self.cluster = ClusterControl(self.state, self.replication)
        self.configs = ConfigControl(self.state)
        self.features = FeatureControl(self.state)
        self.acls = AclControl(self.state)

    # -- the shared state --------------------------------------------------------

    @property
    def options(self) -> ControllerOptions:
        return self.state.options

    @property
    def rng(self) -> random.Random:
        return self.state.rng

    @property
    def heartbeats(self) -> HeartbeatManager:
        return self.state.heartbeats

    @property
    def image(self) -> MetadataImage:
        """The speculative image the decisions see."""
        return self.state.image

    @property
    def next_offset(self) -> int:
        """The offset the next written record will get."""
        return self.state.next_offset

    @next_offset.setter
    def next_offset(self, offset: int) -> None:
        self.state.next_offset = offset

    # -- the speculative image ------------------------------------------------

    def reset(self, committed: MetadataImage) -> None:
        self.state.image = committed

    def activate(self, committed: MetadataImage, now_ms: int) -> list[Record]:
        """Take over: the committed image, fresh sessions for every broker,
        and the records a new active controller writes (bootstrap feature
        levels on a new cluster, the removal of broker-level
        min.insync.replicas, elections its predecessor lost; a NoOp
        otherwise, to open its term)."""
        self.state.image = committed
        self.state.heartbeats.reset(list(committed.brokers.keys()), now_ms)
        records = (
            self.features.bootstrap_levels()
            + self.configs.broker_min_isr_removals()
            + self.replication.elections_on_activation()
        )
        return records or [NoOpRecord()]

    def replay(self, records: Sequence[Record], base_offset: int, epoch: int) -> None:
        """Apply records just written (not yet committed) to the
        speculative image."""
        delta = MetadataDelta(self.state.image)
        for i, record in enumerate(records):
            delta.replay(record, base_offset + i, epoch)
        self.state.image = delta.apply()

    # -- brokers (ClusterControl) ----------------------------------------------

    def register_broker(self, req: RegisterRequest, now_ms: int) -> ControllerResult[int]:
        return self.cluster.register_broker(req=req, now_ms=now_ms)

    def heartbeat(self, req: HeartbeatRequest, now_ms: int) -> ControllerResult[HeartbeatResponse]:
        return self.cluster.heartbeat(req=req, now_ms=now_ms)

    def fence_expired(self, now_ms: int, limit: int = 1) -> ControllerResult[list[int]]:
        return self.cluster.fence_expired(now_ms=now_ms, limit=limit)

    def unregister_broker(self, broker_id: int) -> ControllerResult[None]:
        return self.cluster.unregister_broker(broker_id=broker_id)

    # -- topics, partitions, leaders (ReplicationControl) ----------------------

    def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        return self.replication.create_topics(topics=topics, validate_only=validate_only)

    def delete_topics(
        self, names: Sequence[str] = (), topic_ids: Sequence[str] = ()
    ) -> ControllerResult[list[ItemResult]]:
        return self.replication.delete_topics(names=names, topic_ids=topic_ids)

    def create_partitions(
        self,
        name: str,
        total: int,
        assignments: Sequence[tuple[int, ...]] = (),
        validate_only: bool = False,
    ) -> ControllerResult[ItemResult]:
        return self.replication.create_partitions(
            name=name, total=total, assignments=assignments, validate_only=validate_only
        )

    def alter_partition(
        self, broker_id: int, broker_epoch: int, items: Sequence[AlterPartitionItem]
    ) -> ControllerResult[list[ItemResult]]:
        return self.replication.alter_partition(
            broker_id=broker_id, broker_epoch=broker_epoch, items=items
        )

    def elect_leaders(
        self, election: Election, partitions: Sequence[tuple[str, int]] | None
    ) -> ControllerResult[list[ItemResult]]:
        return self.replication.elect_leaders(election=election, partitions=partitions)

    def rebalance_leaders(self) -> ControllerResult[int]:
        return self.replication.rebalance_leaders()

    def alter_reassignments(
        self, items: Sequence[tuple[str, int, tuple[int, ...] | None]]
    ) -> ControllerResult[list[ItemResult]]:
        return self.replication.alter_reassignments(items=items)

    def list_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int, PartitionRegistration]]:
        return self.replication.list_reassignments(partitions=partitions)

    # -- configs (ConfigControl) -----------------------------------------------

    def alter_configs(
        self,
        changes: Sequence[tuple[ResourceType, str, Sequence[AlterConfigOp]]],
        validate_only: bool = False,
    ) -> ControllerResult[list[ItemResult]]:
        return self.configs.alter_configs(changes=changes, validate_only=validate_only)

    # -- features and producer ids (FeatureControl) ----------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> ControllerResult[tuple[int, int]]:
        return self.features.allocate_producer_ids(broker_id=broker_id, broker_epoch=broker_epoch)

    def update_features(
        self, updates: Mapping[str, int], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        return self.features.update_features(updates=updates, validate_only=validate_only)

    # -- ACLs (AclControl) -------------------------------------------------------

    def create_acls(self, acls: Sequence[StandardAcl]) -> ControllerResult[list[ItemResult]]:
        return self.acls.create_acls(acls=acls)

    def delete_acls(
        self, filters: Sequence[AclBindingFilter]
    ) -> ControllerResult[list[list[tuple[str, StandardAcl]] | ApiError]]:
        return self.acls.delete_acls(filters=filters)

    def noop(self) -> ControllerResult[None]:
        return ControllerResult([NoOpRecord()], None)

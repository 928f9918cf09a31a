"""Cluster metadata: records, the immutable image, and the active controller.

The layers, bottom up:

- :mod:`metadata.records`: the metadata records and their encoding;
- :mod:`metadata.image`, :mod:`metadata.delta`: the immutable
  :class:`MetadataImage` and the :class:`MetadataDelta` that replays records
  into the next one;
- :mod:`metadata.state_machine`: the quorum state machine that replays
  committed records (controllers and brokers alike);
- :mod:`metadata.controller` (with :mod:`metadata.partition_change`,
  :mod:`metadata.placement`, :mod:`metadata.configs`,
  :mod:`metadata.heartbeats`): the decisions, pure;
- :mod:`metadata.active`, :mod:`metadata.server`, :mod:`metadata.service`:
  the controller at run time on a quorum node, and its gRPC services;
- :mod:`metadata.client` and the ``kq topics|configs|brokers|...`` commands.

See docs/metadata.md.
"""

from metadata.delta import LocalReplicaChanges, MetadataDelta
from metadata.errors import ApiError, Errors
from metadata.image import (
    BrokerRegistration,
    MetadataImage,
    PartitionRegistration,
    TopicIdPartition,
    TopicImage,
)
from metadata.state_machine import ControllerStateMachine

__all__ = [
    "ApiError",
    "BrokerRegistration",
    "ControllerStateMachine",
    "Errors",
    "LocalReplicaChanges",
    "MetadataDelta",
    "MetadataImage",
    "PartitionRegistration",
    "TopicIdPartition",
    "TopicImage",
]

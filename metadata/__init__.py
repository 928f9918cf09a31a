"""Cluster metadata: records, the immutable image, and the active controller.

The layers, bottom up:

- :mod:`metadata.records`: the metadata records and their encoding;
- :mod:`metadata.image`, :mod:`metadata.delta`: the immutable
  :class:`MetadataImage` and the :class:`MetadataDelta` that replays records
  into the next one;
- :mod:`metadata.state_machine`: the quorum state machine that replays
  committed records (controllers and brokers alike);
- :mod:`metadata.controller`: the decisions, pure, behind one facade over
  Kafka's control managers sharing :mod:`metadata.control_state`:
  :mod:`metadata.cluster_control` (brokers), :mod:`metadata.replication_control`
  (topics, partitions, leaders, ISRs), :mod:`metadata.config_control`,
  :mod:`metadata.feature_control` (features, producer ids),
  :mod:`metadata.acl_control` (ACL bindings, :mod:`metadata.acls`); their requests
  and results are :mod:`metadata.requests`; with
  :mod:`metadata.partition_change`, :mod:`metadata.placement`,
  :mod:`metadata.configs` and :mod:`metadata.heartbeats`;
- :mod:`metadata.authorizer`: Kafka StandardAuthorizer's decisions over
  the image's ACL bindings, pure;
- :mod:`metadata.active`, :mod:`metadata.server`, :mod:`metadata.service`:
  the controller at run time, a plug-in of a quorum node that sees the
  quorum through its seams (``RaftClient``, ``PluginHost``), and its gRPC
  services;
- :mod:`metadata.client`: the client of those services (the ``kq
  topics|configs|brokers|...`` commands are :mod:`kq.commands`).

See docs/metadata.md.
"""

from metadata.delta import MetadataDelta
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
    "MetadataDelta",
    "MetadataImage",
    "PartitionRegistration",
    "TopicIdPartition",
    "TopicImage",
]

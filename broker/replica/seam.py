"""What the replica state machine needs of a partition's log and of the
cluster's broker registrations: two narrow ``Protocol`` seams.

:class:`ReplicaLog` is the part of :class:`partition_log.PartitionLog` that
replication uses (``UnifiedLog`` as ``Partition`` and the fetcher call it);
``PartitionLog`` satisfies it (checked by mypy in the tests).
:class:`BrokerView` gives the broker registrations of the metadata image, for
ISR eligibility (KIP-841, KIP-903: ``MetadataCache.getAliveBrokerEpoch``,
``isBrokerFenced``, ``isBrokerShuttingDown``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from metadata.image import BrokerRegistration
from partition_log.epoch_cache import LeaderEpochCache
from partition_log.log import AppendInfo, AppendOrigin
from partition_log.log_config import LogConfig

__all__ = ["BrokerView", "MappingBrokerView", "ReplicaLog"]


class ReplicaLog(Protocol):
    """A replica's log as replication sees it."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def epoch_cache(self) -> LeaderEpochCache: ...

    @property
    def size(self) -> int: ...

    @property
    def config(self) -> LogConfig: ...

    def append_as_leader(
        self,
        batch_bytes: bytes,
        leader_epoch: int,
        now_ms: int,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        marker_bumps_epoch: bool = False,
    ) -> AppendInfo: ...

    def append_as_follower(self, batch_bytes: bytes, now_ms: int = 0) -> AppendInfo: ...

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes: ...

    def truncate_to(self, offset: int) -> int: ...

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None: ...

    def maybe_increment_high_watermark(self, offset: int) -> bool: ...

    def delete_records(self, offset: int, now_ms: int | None = None) -> int: ...

    def maybe_assign_epoch_start_offset(self, leader_epoch: int) -> bool: ...


class BrokerView(Protocol):
    """The registrations of the brokers, as the latest metadata image has
    them."""

    def registration(self, broker_id: int) -> BrokerRegistration | None: ...


class MappingBrokerView:
    """A :class:`BrokerView` over a mapping (``MetadataImage.brokers``); its
    owner replaces ``brokers`` as new images arrive."""

    def __init__(self, brokers: Mapping[int, BrokerRegistration]) -> None:
        self.brokers = brokers

    def registration(self, broker_id: int) -> BrokerRegistration | None:
        return self.brokers.get(broker_id)

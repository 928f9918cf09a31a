"""What the control managers share: the speculative image they decide on,
the offset the next record gets, broker sessions, and the lookups every
manager makes.  :meth:`ControlState.after` decides as if records already
written in this decision had been replayed (Kafka's timeline snapshots)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TypeVar

from metadata import configs
from metadata.configs import ResourceType
from metadata.delta import MetadataDelta
from metadata.errors import ApiError, Errors
from metadata.heartbeats import HeartbeatManager
from metadata.image import BrokerRegistration, MetadataImage, TopicImage
from metadata.placement import UsableBroker
from metadata.records import Record
from metadata.requests import ControllerOptions

__all__ = ["ControlState"]

T = TypeVar("T")


class ControlState:
    def __init__(self, options: ControllerOptions, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        # The speculative image: the committed one plus what this controller
        # wrote and has not yet seen committed.
        self.image = MetadataImage()
        self.heartbeats = HeartbeatManager(options.session_timeout_ms)
        # The offset the next written record will get (the node knows it;
        # the driver sets it before each decision).
        self.next_offset = 0

    def active(self, broker_id: int) -> bool:
        b = self.image.brokers.get(broker_id)
        return b is not None and b.active

    def cluster_config(self) -> Mapping[str, str]:
        return self.image.config((int(ResourceType.CLUSTER), ""))

    def topic_config(self, topic: TopicImage, key: str) -> str:
        return configs.effective(
            key,
            topic=self.image.config((int(ResourceType.TOPIC), topic.name)),
            cluster=self.cluster_config(),
        )

    def broker(self, broker_id: int, broker_epoch: int | None = None) -> BrokerRegistration:
        b = self.image.brokers.get(broker_id)
        if b is None:
            raise ApiError(Errors.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered")
        if broker_epoch is not None and b.epoch != broker_epoch:
            raise ApiError(
                Errors.STALE_BROKER_EPOCH,
                f"broker {broker_id} is registered with epoch {b.epoch}, not {broker_epoch}",
            )
        return b

    def after(self, records: list[Record], then: Callable[[], T]) -> T:
        """``then()`` decided on the image as if ``records`` had been
        replayed (they will be, before anything ``then`` returns)."""
        saved = self.image
        delta = MetadataDelta(saved)
        for i, record in enumerate(records):
            delta.replay(record, self.next_offset + i, saved.epoch)
        self.image = delta.apply()
        try:
            return then()
        finally:
            self.image = saved

    def usable_brokers(self) -> list[UsableBroker]:
        return [
            UsableBroker(b.broker_id, b.rack, not b.active)
            for b in sorted(self.image.brokers.values(), key=lambda b: b.broker_id)
        ]

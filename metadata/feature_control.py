"""Feature levels (Kafka's FeatureControlManager, KIP-584) and producer id
blocks (its ProducerIdControlManager, KIP-730).  Pure: decisions only."""

from __future__ import annotations

from collections.abc import Mapping

from metadata.control_state import ControlState
from metadata.errors import ApiError, Errors
from metadata.records import (
    FeatureLevelRecord,
    ProducerIdsRecord,
    Record,
)
from metadata.requests import (
    METADATA_VERSION,
    PRODUCER_ID_BLOCK,
    SUPPORTED_FEATURES,
    ControllerResult,
    ItemResult,
)

__all__ = ["FeatureControl"]


class FeatureControl:
    """Decides on :class:`ControlState`'s image; changes nothing."""

    def __init__(self, state: ControlState) -> None:
        self.state = state

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> ControllerResult[tuple[int, int]]:
        b = self.state.broker(broker_id, broker_epoch)
        if b.fenced:
            raise ApiError(Errors.BROKER_NOT_AVAILABLE, f"broker {broker_id} is fenced")
        first = self.state.image.next_producer_id
        record = ProducerIdsRecord(broker_id, broker_epoch, first + PRODUCER_ID_BLOCK)
        return ControllerResult([record], (first, PRODUCER_ID_BLOCK))

    def update_features(
        self, updates: Mapping[str, int], validate_only: bool = False
    ) -> ControllerResult[list[ItemResult]]:
        results: list[ItemResult] = []
        records: list[Record] = []
        for name, level in updates.items():
            try:
                if name not in SUPPORTED_FEATURES:
                    raise ApiError(Errors.INVALID_FEATURE_UPDATE, f"unknown feature {name}")
                if level == 0 and name == METADATA_VERSION:
                    raise ApiError(
                        Errors.INVALID_FEATURE_UPDATE,
                        f"{name} cannot be removed: every record is read at its level",
                    )
                low, high = SUPPORTED_FEATURES[name]
                if not low <= level <= high:
                    raise ApiError(
                        Errors.INVALID_FEATURE_UPDATE,
                        f"{name} level {level} is outside this controller's {low}..{high}",
                    )
                for b in self.state.image.brokers.values():
                    ranges = {f.name: f for f in b.features}
                    f = ranges.get(name)
                    if f is None or not f.min_level <= level <= f.max_level:
                        raise ApiError(
                            Errors.INVALID_FEATURE_UPDATE,
                            f"broker {b.broker_id} does not support {name} level {level}",
                        )
            except ApiError as exc:
                results.append(ItemResult(name, exc.code, exc.message))
                continue
            if self.state.image.features.get(name) != level:
                records.append(FeatureLevelRecord(name, level))
            results.append(ItemResult(name))
        return ControllerResult([] if validate_only else records, results)

    def bootstrap_levels(self) -> list[Record]:
        """A new cluster finalizes the highest level of every feature this
        build supports."""
        return [
            FeatureLevelRecord(name, highest)
            for name, (_, highest) in SUPPORTED_FEATURES.items()
            if name not in self.state.image.features
        ]

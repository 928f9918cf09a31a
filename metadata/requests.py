"""What the controller's decisions take and give: requests, results,
limits and the checks of names, shared by the control managers
(:mod:`metadata.controller` re-exports them)."""

from __future__ import annotations

import base64
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from metadata.errors import ApiError, Errors
from metadata.image import (
    PartitionRegistration,
)
from metadata.records import (
    Endpoint,
    FeatureRange,
    Record,
)

__all__ = [
    "MAX_ELECTIONS_PER_REBALANCE",
    "MAX_RECORDS_PER_ATOMIC_OP",
    "MAX_TOPIC_NAME",
    "METADATA_VERSION",
    "PRODUCER_ID_BLOCK",
    "SUPPORTED_FEATURES",
    "AlterConfigOp",
    "AlterPartitionItem",
    "ControllerOptions",
    "ControllerResult",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "ItemResult",
    "NewTopic",
    "RegisterRequest",
    "check_topic_name",
    "items_ok",
    "new_topic_id",
]

T = TypeVar("T")

# Feature levels this build supports (KIP-584); a new cluster finalizes the
# highest.  metadata.version 1 is this build's record set.
METADATA_VERSION = "metadata.version"
SUPPORTED_FEATURES: Mapping[str, tuple[int, int]] = {METADATA_VERSION: (1, 1)}

# Kafka's producer id block size (KIP-730).
PRODUCER_ID_BLOCK = 1000
# Kafka's MAX_RECORDS_PER_USER_OP: an atomic operation must fit one batch.
MAX_RECORDS_PER_ATOMIC_OP = 10_000
# Kafka's MAX_ELECTIONS_PER_IMBALANCE.
MAX_ELECTIONS_PER_REBALANCE = 1_000

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_NAME = 249


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    cluster_id: str
    session_timeout_ms: int = 9_000
    # KIP-966's last known leader: with no ISR or ELR member left, the
    # partition's last leader is elected (uncleanly) once unfenced.  Kafka's
    # PartitionChangeBuilder.useLastKnownLeaderInBalancedRecovery, true by
    # default and not a broker config there.
    use_last_known_leader: bool = True


@dataclass(frozen=True, slots=True)
class ControllerResult(Generic[T]):
    records: list[Record]
    response: T
    # True: the records must commit together (one batch); False: they may
    # be split over several (elections after a fence: each change stands
    # alone).
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class ItemResult:
    """The outcome of one item of a batch request (a topic, a partition, a
    config resource)."""

    name: str
    error: Errors = Errors.NONE
    message: str = ""
    # Per-request extras (a created topic's id and sizes, a partition's
    # new state).
    topic_id: str = ""
    partition: int = -1
    num_partitions: int = -1
    replication_factor: int = -1
    partition_state: PartitionRegistration | None = None


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    # partition -> replicas; all partitions or none.
    assignments: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    broker_id: int
    cluster_id: str
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    features: tuple[FeatureRange, ...] = ()
    previous_broker_epoch: int = -1
    # Its log directories' ids (KIP-858).
    log_dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    broker_id: int
    broker_epoch: int
    # The offset of the last metadata record the broker has applied
    # (inclusive, as Kafka's currentMetadataOffset; -1: none): caught up
    # once it reaches the broker's registration record.
    current_metadata_offset: int
    want_fence: bool = False
    want_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    is_caught_up: bool
    is_fenced: bool
    in_controlled_shutdown: bool
    should_shut_down: bool


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    key: str
    # None: delete the override.
    value: str | None
    # Conditional update: apply only if the current override is
    # ``expected`` (``expect_absent``: only if there is none).
    expected: str | None = None
    expect_absent: bool = False

    @property
    def conditional(self) -> bool:
        return self.expected is not None or self.expect_absent


@dataclass(frozen=True, slots=True)
class AlterPartitionItem:
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    # (broker id, broker epoch or -1)
    new_isr: tuple[tuple[int, int], ...]
    leader_recovered: bool = False


def new_topic_id(rng: random.Random) -> str:
    """A topic id: 16 random bytes, shown as Kafka shows them (url-safe
    base64 without padding)."""
    raw = rng.getrandbits(128).to_bytes(16, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def check_topic_name(name: str) -> None:
    if not name or name in (".", ".."):
        raise ApiError(Errors.INVALID_TOPIC_NAME, f"topic name {name!r} is not allowed")
    if len(name) > MAX_TOPIC_NAME:
        raise ApiError(
            Errors.INVALID_TOPIC_NAME,
            f"topic name is {len(name)} characters long; at most {MAX_TOPIC_NAME} are allowed",
        )
    if not _TOPIC_NAME.fullmatch(name):
        raise ApiError(
            Errors.INVALID_TOPIC_NAME,
            f"topic name {name!r} may hold only ASCII letters, digits, '.', '_' and '-'",
        )


def items_ok(results: Iterable[ItemResult]) -> bool:
    return all(r.error is Errors.NONE for r in results)

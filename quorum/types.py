"""Value types shared by the consensus core, its stores and its drivers.

Everything here is an immutable value: frozen, slotted dataclasses and enums.
Offsets follow Kafka's convention: a batch holding ``n`` records starting at
``base_offset`` occupies offsets ``base_offset .. base_offset + n - 1`` and its
*end offset* (exclusive) is ``base_offset + n``.  A log's *end offset* (LEO) is
the end offset of its last batch.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

NodeId = int

# Epochs travel and are stored as int32, as Kafka's leader epoch.  A node
# holds at most MAX_EPOCH: never 2**31-1, the epoch no election could leave
# (its successor does not fit).  A node at MAX_EPOCH keeps its leader but
# starts no election (RaftCore refuses to); epochs past it in a message or in
# storage are refused.
MAX_EPOCH = 2**31 - 2

__all__ = [
    "MAX_EPOCH",
    "Batch",
    "BatchKind",
    "LeaderAndEpoch",
    "LeaderChange",
    "NodeId",
    "OffsetAndEpoch",
    "QuorumState",
    "Role",
    "SnapshotId",
    "VoterSet",
]


class Role(enum.Enum):
    """The replica states of KRaft (KIP-595 with KIP-996's Prospective)."""

    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


class BatchKind(enum.IntEnum):
    """What a batch carries.  Control batches are written by the core itself."""

    DATA = 0
    # Opens every leader epoch (KIP-595 LeaderChangeMessage); gives the new
    # leader a record of its own epoch to commit (Raft thesis 3.6.2).
    LEADER_CHANGE = 1


@dataclass(frozen=True, slots=True, order=True)
class OffsetAndEpoch:
    """An (end offset, epoch) pair; ordered by epoch first, as logs compare."""

    epoch: int
    offset: int


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """A snapshot covers every offset below ``end_offset``; ``epoch`` is the
    epoch of the batch holding offset ``end_offset - 1`` (KIP-630)."""

    end_offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Batch:
    """A record batch: the unit of append, replication and commit.

    Invariant: ``records`` is non-empty and every record of one batch was
    written by the leader of ``epoch``.
    """

    base_offset: int
    epoch: int
    records: tuple[bytes, ...]
    kind: BatchKind = BatchKind.DATA

    @property
    def end_offset(self) -> int:
        return self.base_offset + len(self.records)

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def size_bytes(self) -> int:
        return sum(len(r) for r in self.records) + 16 * len(self.records)


@dataclass(frozen=True, slots=True)
class VoterSet:
    """The static voter set.

    Kept as a value with a byte encoding so that KIP-853 (dynamic voters) can
    later carry it in a VotersRecord in the log without changing its users.
    """

    voters: frozenset[NodeId]

    def __post_init__(self) -> None:
        if not self.voters:
            raise ValueError("a voter set needs at least one voter")
        if any(v < 0 for v in self.voters):
            raise ValueError(f"voter ids must be non-negative: {sorted(self.voters)}")

    @classmethod
    def of(cls, *ids: NodeId) -> VoterSet:
        return cls(frozenset(ids))

    def __contains__(self, node: object) -> bool:
        return node in self.voters

    def __len__(self) -> int:
        return len(self.voters)

    def majority(self) -> int:
        """The number of voters that makes a majority."""
        return len(self.voters) // 2 + 1

    def sorted(self) -> list[NodeId]:
        return sorted(self.voters)

    def encode(self) -> bytes:
        return json.dumps({"version": 0, "voters": self.sorted()}).encode()

    @classmethod
    def decode(cls, data: bytes) -> VoterSet:
        obj = _decode_record(data, "voter set")
        return cls(frozenset(_node_ids(obj, "voters", "voter set")))


@dataclass(frozen=True, slots=True)
class LeaderChange:
    """Body of the LEADER_CHANGE control record (KIP-595 LeaderChangeMessage)."""

    leader_id: NodeId
    voters: tuple[NodeId, ...]
    granting_voters: tuple[NodeId, ...]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 0,
                "leader_id": self.leader_id,
                "voters": list(self.voters),
                "granting_voters": list(self.granting_voters),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaderChange:
        what = "leader-change"
        obj = _decode_record(data, what)
        return cls(
            _node_id(obj.get("leader_id"), "leader_id", what),
            tuple(_node_ids(obj, "voters", what)),
            tuple(_node_ids(obj, "granting_voters", what)),
        )


@dataclass(frozen=True, slots=True)
class QuorumState:
    """The election state that must be durable before it is acted on.

    Mirrors Kafka's ``quorum-state`` file.  Invariant: at most one of
    ``voted_for`` and ``leader_id`` matters for the epoch; a vote granted in
    ``epoch`` is never changed within ``epoch``.
    """

    epoch: int = 0
    voted_for: NodeId | None = None
    leader_id: NodeId | None = None


@dataclass(frozen=True, slots=True)
class LeaderAndEpoch:
    leader_id: NodeId | None
    epoch: int


def _decode_record(data: bytes, what: str) -> dict[str, object]:
    """Parse a version-0 JSON record, or raise ValueError saying what is wrong."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed {what} record: not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"malformed {what} record: expected an object, got {type(obj).__name__}")
    if obj.get("version") != 0:
        raise ValueError(f"unknown {what} version {obj.get('version')!r}")
    return obj


def _node_id(value: object, field: str, what: str) -> int:
    # bool is an int in Python; a node id never is one.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"malformed {what} record: {field} holds {value!r}, not a non-negative node id"
        )
    return value


def _node_ids(obj: dict[str, object], field: str, what: str) -> list[int]:
    values = obj.get(field)
    if not isinstance(values, list):
        raise ValueError(f"malformed {what} record: {field} is {values!r}, not a list")
    return [_node_id(v, field, what) for v in values]

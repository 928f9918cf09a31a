"""The replicated key-value store's state machine (pure).

A plug-in of the node beside the metadata controller: it shares the log
with it (:class:`quorum.shared_log.SharedLog`) and serves the CLI, the
benchmarks and the chaos workloads.  Every record is one operation, encoded
with msgpack:

- ``["put", key, value]``
- ``["putm", [[key, value], ...]]``: many puts in one record, applied in
  order (one record for a whole PutMany keeps the per-record cost of the log
  off each put, as a Kafka producer's batch does)
- ``["cas", key, expected, value]`` (``expected`` None means "absent")
- ``["del", key]``

Applying is deterministic, so every replica holds the same map and computes
the same result for each record: ``("ok",)`` or ``("precondition", current)``
where ``current`` is the value found (None if absent).  Each key remembers
the (offset, epoch) of the write that set it: its version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from quorum.types import Batch, BatchKind, LeaderAndEpoch, SnapshotId

__all__ = [
    "CasResult",
    "KvStateMachine",
    "Versioned",
    "encode_cas",
    "encode_delete",
    "encode_put",
    "encode_put_many",
    "is_kv_record",
]

# 1: the rows; 0 (still read): also the log digest, which is the node's
# shared log's now.
SNAPSHOT_VERSION = 1
SNAPSHOT_VERSIONS = (0, 1)

MAX_KEY_BYTES = 1024
MAX_VALUE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Versioned:
    value: bytes
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class CasResult:
    """The outcome of one record: ``ok``, or the value that failed a CAS."""

    ok: bool
    current: bytes | None = None


OK = CasResult(True)


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError("a key must be a non-empty string")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"key is longer than {MAX_KEY_BYTES} bytes")


def _check_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise ValueError(f"a value must be bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"value is longer than {MAX_VALUE_BYTES} bytes")


def is_kv_record(data: bytes) -> bool:
    """True for a record of this store: a msgpack array whose first element
    is a short string (the operation's name), from the first two bytes.
    (Metadata records are arrays whose first element is a small integer.)"""
    return len(data) >= 2 and 0x91 <= data[0] <= 0x9F and 0xA0 <= data[1] <= 0xBF


def encode_put(key: str, value: bytes) -> bytes:
    _check_key(key)
    _check_value(value)
    return bytes(msgpack.packb(["put", key, value]))


def encode_put_many(items: Sequence[tuple[str, bytes]]) -> bytes:
    if not items:
        raise ValueError("a multi-put needs at least one put")
    for key, value in items:
        _check_key(key)
        _check_value(value)
    return bytes(msgpack.packb(["putm", [[k, v] for k, v in items]]))


def encode_cas(key: str, expected: bytes | None, value: bytes) -> bytes:
    _check_key(key)
    _check_value(value)
    if expected is not None:
        _check_value(expected)
    return bytes(msgpack.packb(["cas", key, expected, value]))


def encode_delete(key: str) -> bytes:
    _check_key(key)
    return bytes(msgpack.packb(["del", key]))


class KvStateMachine:
    """Implements :class:`quorum.shared_log.LogPart` (and so
    :class:`quorum.listener.StateMachine`): alone on a log, or sharing it."""

    def __init__(self) -> None:
        self._data: dict[str, Versioned] = {}
        self._applied = 0
        self.leader = LeaderAndEpoch(None, 0)

    @property
    def applied_offset(self) -> int:
        return self._applied

    def get(self, key: str) -> Versioned | None:
        return self._data.get(key)

    def __len__(self) -> int:
        return len(self._data)

    def owns(self, record: bytes) -> bool:
        return is_kv_record(record)

    def handle_commit(self, batch: Batch) -> Sequence[object]:
        """Apply a batch; records of other state machines sharing the log
        are skipped (their answer None)."""
        if batch.base_offset != self._applied:
            raise ValueError(
                f"batch at offset {batch.base_offset} applied after offset {self._applied}"
            )
        self._applied = batch.end_offset
        if batch.kind is not BatchKind.DATA:
            return [OK] * len(batch.records)
        return [
            self.apply_record(record, batch.base_offset + i, batch.epoch)
            if is_kv_record(record)
            else None
            for i, record in enumerate(batch.records)
        ]

    def apply_record(self, record: bytes, offset: int, epoch: int) -> CasResult:
        """Apply one key-value record at ``offset``."""
        op = _decode(record)
        if op[0] == "put":
            self._data[op[1]] = Versioned(op[2], offset, epoch)
            return OK
        if op[0] == "del":
            self._data.pop(op[1], None)
            return OK
        if op[0] == "putm":
            for key, value in op[1]:
                self._data[key] = Versioned(value, offset, epoch)
            return OK
        _, key, expected, value = op
        current = self._data.get(key)
        found = current.value if current is not None else None
        if found != expected:
            return CasResult(False, found)
        self._data[key] = Versioned(value, offset, epoch)
        return OK

    def handle_load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        try:
            obj = msgpack.unpackb(data)
            if obj["end_offset"] != snapshot_id.end_offset:
                raise ValueError(f"snapshot holds the state at {obj['end_offset']}")
            if "metadata" in obj and "kv" in obj:
                # A controller's snapshot from before the store was a
                # plug-in of its own: its key-value rows.
                rows = obj["kv"]
            elif obj["version"] in SNAPSHOT_VERSIONS:
                rows = obj["items"]
            else:
                raise ValueError(
                    f"snapshot format version {obj['version']!r}; this build reads "
                    f"{', '.join(map(str, SNAPSHOT_VERSIONS))}"
                )
            items = {str(k): Versioned(bytes(v), int(o), int(e)) for k, v, o, e in rows}
        except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"malformed key-value snapshot {snapshot_id}: {exc}") from exc
        self._data = items
        self._applied = snapshot_id.end_offset

    def export_items(self) -> list[list[Any]]:
        """The map as ``[key, value, offset, epoch]`` rows, sorted by key."""
        return [[k, v.value, v.offset, v.epoch] for k, v in sorted(self._data.items())]

    def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.leader = leader

    def capture_snapshot(self) -> Callable[[], bytes]:
        # A shallow copy of the map is enough: Versioned entries are
        # immutable, and a copy costs far less than encoding.
        data, applied = dict(self._data), self._applied
        return lambda: _encode_snapshot(data, applied)

    def snapshot(self) -> bytes:
        return _encode_snapshot(self._data, self._applied)


def _encode_snapshot(data: dict[str, Versioned], applied: int) -> bytes:
    items = [[k, v.value, v.offset, v.epoch] for k, v in sorted(data.items())]
    return bytes(
        msgpack.packb({"version": SNAPSHOT_VERSION, "end_offset": applied, "items": items})
    )


def _decode(record: bytes) -> list[Any]:
    """Decode one record; a record that does not decode is a bug upstream
    (records are encoded by the functions above), so fail loudly."""
    op = msgpack.unpackb(record)
    if not isinstance(op, list) or not op or op[0] not in ("put", "putm", "cas", "del"):
        raise ValueError(f"not a key-value record: {op!r}")
    if (op[0], len(op)) not in (("put", 3), ("putm", 2), ("cas", 4), ("del", 2)):
        raise ValueError(f"malformed {op[0]} record: {op!r}")
    return op

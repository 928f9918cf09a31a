"""Several state machines on one log: the node's plug-ins share it.

A controller's log carries the metadata records and the key-value store's;
each plug-in brings the state machine of its own records (a
:class:`LogPart`), and the node applies them all through one
:class:`SharedLog`, which is the node's
:class:`~quorum.listener.StateMachine`.  Kafka's ``RaftClient.register``
takes many listeners in the same way; kq's parts also answer their own
records' proposals, so each record is owned by exactly one part.

- Every part sees every committed batch in log order (it keeps its applied
  offset and sees each epoch's LeaderChange), applies the records it owns
  and answers None for the others; :meth:`SharedLog.handle_commit` returns,
  for each record, the answer a part gave (None when none did).  A record
  that no part owns belongs to a plug-in this node does not run (an
  observer may replay the metadata alone): every part skips it.  The parts'
  ``owns`` must be disjoint (decided from a record's first bytes; the
  plug-ins' tests check it): the log asks no part twice per record.
- A snapshot holds each part's snapshot under its name, with the chained
  digest of the whole log (equal on two nodes iff they applied the same
  log).  A snapshot written before the log was shared (a single state
  machine's) is handed whole to every part, which takes what it knows of
  it (the parts' loaders read those formats).

Pure: no I/O, clock or threads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Protocol

import msgpack

from quorum.listener import StateMachine
from quorum.types import Batch, LeaderAndEpoch, SnapshotId

__all__ = ["LogPart", "SharedLog", "chain_digest"]

SHARED_LOG_VERSION = 1


class LogPart(StateMachine, Protocol):
    """A state machine that shares the log with others."""

    def owns(self, record: bytes) -> bool:
        """True for the records this part applies and answers (decided from
        the record's bytes alone: every node must decide alike)."""
        ...


def chain_digest(chain: bytes, batch: Batch) -> bytes:
    """sha256 of the previous digest and ``batch`` (offset, epoch, kind,
    records): chained over a log, equal on two replicas iff they applied
    the same batches."""
    h = hashlib.sha256(chain)
    h.update(b"%d:%d:%d" % (batch.base_offset, batch.epoch, int(batch.kind)))
    for record in batch.records:
        h.update(len(record).to_bytes(4, "big"))
        h.update(record)
    return h.digest()


class SharedLog:
    """Implements :class:`quorum.listener.StateMachine` over named parts."""

    def __init__(self, parts: Sequence[tuple[str, LogPart]]) -> None:
        names = [name for name, _ in parts]
        if not parts or len(set(names)) != len(names):
            raise ValueError(f"a shared log needs parts with distinct names, got {names}")
        self.parts = tuple(parts)
        # Invariant: every part has applied exactly up to this offset.
        self._applied = 0
        self._chain = bytes(32)

    def part(self, name: str) -> LogPart:
        for part_name, part in self.parts:
            if part_name == name:
                return part
        raise LookupError(f"no part named {name!r}")

    @property
    def applied_offset(self) -> int:
        return self._applied

    def digest(self) -> bytes:
        """The chained digest of every batch applied (constant time)."""
        return self._chain

    def handle_commit(self, batch: Batch) -> Sequence[object]:
        if batch.base_offset != self._applied:
            raise ValueError(
                f"batch at offset {batch.base_offset} applied after offset {self._applied}"
            )
        answers = [part.handle_commit(batch) for _, part in self.parts]
        self._applied = batch.end_offset
        self._chain = chain_digest(self._chain, batch)
        if len(answers) == 1:
            return answers[0]
        # Each record has one owner, and the others answered None for it.
        return [
            next((a for a in column if a is not None), None)
            for column in zip(*answers, strict=True)
        ]

    def handle_load_snapshot(self, snapshot_id: SnapshotId, data: bytes) -> None:
        parts, chain = decode_snapshot(snapshot_id, data, [name for name, _ in self.parts])
        for name, part in self.parts:
            part.handle_load_snapshot(snapshot_id, parts[name])
        self._applied = snapshot_id.end_offset
        self._chain = chain

    def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        for _, part in self.parts:
            part.handle_leader_change(leader)

    def snapshot(self) -> bytes:
        return self.capture_snapshot()()

    def capture_snapshot(self) -> Callable[[], bytes]:
        captures = [(name, part.capture_snapshot()) for name, part in self.parts]
        applied, chain = self._applied, self._chain

        def encode() -> bytes:
            doc = {
                "shared_log": SHARED_LOG_VERSION,
                "end_offset": applied,
                "chain": chain,
                "parts": {name: capture() for name, capture in captures},
            }
            return bytes(msgpack.packb(doc))

        return encode


def decode_snapshot(
    snapshot_id: SnapshotId, data: bytes, names: Sequence[str]
) -> tuple[dict[str, bytes], bytes]:
    """Each part's snapshot bytes and the log digest; ValueError naming what
    is wrong with a malformed snapshot."""
    try:
        doc = msgpack.unpackb(data)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
        if "shared_log" not in doc:
            # Written by a single state machine, before the log was shared.
            return dict.fromkeys(names, data), _chain_of(doc)
        if doc["shared_log"] != SHARED_LOG_VERSION:
            raise ValueError(
                f"shared-log snapshot version {doc['shared_log']!r}; this build reads "
                f"{SHARED_LOG_VERSION}"
            )
        if doc["end_offset"] != snapshot_id.end_offset:
            raise ValueError(f"it holds the state at offset {doc['end_offset']}")
        parts = doc["parts"]
        missing = [name for name in names if name not in parts]
        if missing:
            raise ValueError(f"it holds no state for {missing}")
        return {name: bytes(parts[name]) for name in names}, _chain_of(doc)
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed snapshot {snapshot_id}: {exc}") from exc


def _chain_of(doc: dict[str, object]) -> bytes:
    chain = doc.get("chain")
    if not isinstance(chain, bytes) or len(chain) != 32:
        raise ValueError("the log digest must be 32 bytes")
    return chain

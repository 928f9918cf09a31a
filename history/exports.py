"""What each node exports after a run: its committed log and its changes.

Two JSON Lines files per node, under ``nodes/<id>/`` of a run folder
(``docs/history-format.md``):

- ``log.jsonl``: one :class:`LogEntry` per committed record, ascending by
  offset: ``{"node":1,"offset":7,"epoch":2,"kind":"data","hash":"<sha256>"}``.
  ``hash`` is the SHA-256 of the record's bytes, in hex.  Offsets may skip
  ranges the node received as a snapshot instead of as records.
- ``changes.jsonl``: one :class:`Change` each time the node's role, epoch or
  leader changed, in time order (``time`` as in the history: nanoseconds
  since the run started).

:func:`check_log` and :func:`check_changes` list what breaks these rules.
Pure (the simulator builds exports with it); :mod:`history.export_files`
reads and writes the files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from history.ops import Problem

__all__ = [
    "LOG_KINDS",
    "ROLES",
    "Change",
    "LogEntry",
    "check_changes",
    "check_log",
    "record_hash",
]

LOG_KINDS: Final = ("data", "control")
"""``data``: a client's record; ``control``: written by the quorum itself
(the leader-change record that opens each epoch)."""

ROLES: Final = ("unattached", "prospective", "candidate", "leader", "follower", "resigned")


def record_hash(record: bytes) -> str:
    """The ``hash`` of one record: SHA-256 of its bytes, lowercase hex."""
    return hashlib.sha256(record).hexdigest()


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One committed record of one node's log."""

    node: int
    offset: int
    epoch: int
    kind: str
    hash: str

    def problems(self) -> list[str]:
        out = [
            f"{name} must be an integer >= 0, got {getattr(self, name)!r}"
            for name in ("node", "offset", "epoch")
            if not _is_count(getattr(self, name))
        ]
        if self.kind not in LOG_KINDS:
            out.append(f"kind must be one of {', '.join(LOG_KINDS)}, got {self.kind!r}")
        if not (
            isinstance(self.hash, str)
            and len(self.hash) == 64
            and all(c in "0123456789abcdef" for c in self.hash)
        ):
            out.append(f"hash must be 64 lowercase hex digits (SHA-256), got {self.hash!r}")
        return out


@dataclass(frozen=True, slots=True)
class Change:
    """A node's role, epoch or leader changed at ``time``."""

    node: int
    time: int
    epoch: int
    leader: int | None
    role: str

    def problems(self) -> list[str]:
        out = [
            f"{name} must be an integer >= 0, got {getattr(self, name)!r}"
            for name in ("node", "time", "epoch")
            if not _is_count(getattr(self, name))
        ]
        if self.leader is not None and not _is_count(self.leader):
            out.append(f"leader must be a node id or null, got {self.leader!r}")
        if self.role not in ROLES:
            out.append(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        return out


def check_log(entries: Sequence[LogEntry], node: int | None = None) -> list[Problem]:
    """What breaks the rules of one node's log export: each entry's fields
    (``invalid-entry``), the node it names (``wrong-node``), offsets
    ascending (``offset-order``), and two safety properties visible in a
    single file: no offset committed twice (``offset-order`` too: an exporter
    writes both records rather than hide one) and epochs never decreasing
    along the log (``epoch-order``).  ``Problem.index`` is the 0-based line."""
    out: list[Problem] = []
    prev: LogEntry | None = None
    for i, entry in enumerate(entries):
        for message in entry.problems():
            out.append(Problem("invalid-entry", message, i))
        if node is not None and entry.node != node:
            out.append(Problem("wrong-node", f"entry of node {entry.node} in node {node}'s log", i))
        if prev is not None:
            if entry.offset <= prev.offset:
                out.append(
                    Problem(
                        "offset-order",
                        f"offset {entry.offset} after offset {prev.offset} (epoch "
                        f"{entry.epoch} after {prev.epoch})",
                        i,
                    )
                )
            elif entry.epoch < prev.epoch:
                out.append(
                    Problem(
                        "epoch-order",
                        f"offset {entry.offset} has epoch {entry.epoch}, below offset "
                        f"{prev.offset}'s {prev.epoch}",
                        i,
                    )
                )
        prev = entry
    return out


def check_changes(changes: Sequence[Change], node: int | None = None) -> list[Problem]:
    """What breaks the rules of one node's changes export: fields
    (``invalid-entry``), the node (``wrong-node``), time never decreasing
    (``time``), and one safety property visible in a single file: a node's
    epoch never decreases, across restarts too (``epoch-order``; epochs
    are durable)."""
    out: list[Problem] = []
    prev: Change | None = None
    for i, change in enumerate(changes):
        for message in change.problems():
            out.append(Problem("invalid-entry", message, i))
        if node is not None and change.node != node:
            out.append(
                Problem("wrong-node", f"change of node {change.node} in node {node}'s file", i)
            )
        if prev is not None:
            if change.time < prev.time:
                out.append(Problem("time", f"time {change.time} after {prev.time}", i))
            if change.epoch < prev.epoch:
                out.append(
                    Problem("epoch-order", f"epoch {change.epoch} after epoch {prev.epoch}", i)
                )
        prev = change
    return out

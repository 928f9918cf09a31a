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
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, TypeVar

from chaos.history import HistoryFormatError, Problem

__all__ = [
    "LOG_KINDS",
    "ROLES",
    "Change",
    "LogEntry",
    "check_changes",
    "check_log",
    "read_changes",
    "read_log",
    "record_hash",
    "write_changes",
    "write_log",
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


_T = TypeVar("_T", LogEntry, Change)


def _line(item: LogEntry | Change) -> str:
    return json.dumps(asdict(item), separators=(",", ":"))


def _write(path: str | os.PathLike[str], items: Iterable[LogEntry | Change]) -> None:
    with open(os.fspath(path), "x", encoding="utf-8", newline="\n") as fh:
        for item in items:
            fh.write(_line(item) + "\n")


def _read(path: str | os.PathLike[str], cls: type[_T]) -> Iterator[_T]:
    name = os.fspath(path)
    fields = set(cls.__dataclass_fields__)
    with open(name, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                raise HistoryFormatError(name, lineno, "empty line")
            try:
                obj: Any = json.loads(line)
            except ValueError as exc:
                raise HistoryFormatError(name, lineno, f"not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise HistoryFormatError(name, lineno, "expected a JSON object")
            if set(obj) != fields:
                missing = sorted(fields - set(obj))
                unknown = sorted(set(obj) - fields)
                why = "; ".join(
                    part
                    for part in (
                        f"missing field(s) {', '.join(missing)}" if missing else "",
                        f"unknown field(s) {', '.join(unknown)}" if unknown else "",
                    )
                    if part
                )
                raise HistoryFormatError(name, lineno, why)
            item = cls(**obj)
            problems = item.problems()
            if problems:
                raise HistoryFormatError(name, lineno, "; ".join(problems))
            yield item


def write_log(path: str | os.PathLike[str], entries: Iterable[LogEntry]) -> None:
    """Write a node's ``log.jsonl`` (a new file)."""
    _write(path, entries)


def read_log(path: str | os.PathLike[str]) -> list[LogEntry]:
    """Parse a ``log.jsonl``; :class:`HistoryFormatError` names a bad line."""
    return list(_read(path, LogEntry))


def write_changes(path: str | os.PathLike[str], changes: Iterable[Change]) -> None:
    """Write a node's ``changes.jsonl`` (a new file)."""
    _write(path, changes)


def read_changes(path: str | os.PathLike[str]) -> list[Change]:
    """Parse a ``changes.jsonl``; :class:`HistoryFormatError` names a bad line."""
    return list(_read(path, Change))


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

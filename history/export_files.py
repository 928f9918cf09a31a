"""Node export files: ``log.jsonl`` and ``changes.jsonl`` of a run folder
(their lines are :mod:`history.exports`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any, TypeVar

from history.exports import Change, LogEntry
from history.ops import HistoryFormatError

__all__ = ["read_changes", "read_log", "write_changes", "write_log"]


_T = TypeVar("_T", LogEntry, Change)


def _line(item: LogEntry | Change) -> str:
    return json.dumps(asdict(item), separators=(",", ":"))


def _write(path: str | os.PathLike[str], items: Iterable[LogEntry | Change]) -> None:
    with open(os.fspath(path), "x", encoding="utf-8", newline="\n") as fh:
        for item in items:
            fh.write(_line(item) + "\n")


def json_objects(path: str | os.PathLike[str]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Each line of the JSON-lines file at ``path`` as ``(file name, line
    number, object)``; :class:`HistoryFormatError` names an empty line, a
    line that is not JSON or one that is not a JSON object."""
    name = os.fspath(path)
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
            yield name, lineno, obj


def _read(path: str | os.PathLike[str], cls: type[_T]) -> Iterator[_T]:
    fields = set(cls.__dataclass_fields__)
    for name, lineno, obj in json_objects(path):
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

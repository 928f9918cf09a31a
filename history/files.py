"""Operation histories as files: JSON Lines, written as a run goes.

``docs/history-format.md`` is the contract.  The records and their rules
are :mod:`history.ops` (pure, shared with the simulator); this module adds:

- :class:`HistoryWriter`: a recorder that appends each op to a file and
  flushes it;
- :func:`read_history` / :func:`iter_history`: parse a file, naming the line
  of any malformed input; :func:`write_history`: write finished ops.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from history.ops import (
    COMPLETIONS,
    FIELDS,
    MODELS,
    NEMESIS,
    NEMESIS_ENDS,
    OP_TYPES,
    PROBLEM_KINDS,
    Clock,
    HistoryError,
    HistoryFormatError,
    HistoryRecorder,
    Op,
    Problem,
    check_well_formed,
    next_process,
    op_problems,
)

__all__ = [
    "COMPLETIONS",
    "FIELDS",
    "MODELS",
    "NEMESIS",
    "NEMESIS_ENDS",
    "OP_TYPES",
    "PROBLEM_KINDS",
    "HistoryError",
    "HistoryFormatError",
    "HistoryRecorder",
    "HistoryWriter",
    "Op",
    "Problem",
    "check_well_formed",
    "iter_history",
    "next_process",
    "op_problems",
    "read_history",
    "write_history",
]


# -- reading and writing files -------------------------------------------------


def iter_history(path: str | os.PathLike[str]) -> Iterator[Op]:
    """The ops of a history file, one at a time; :class:`HistoryFormatError`
    names the first malformed line."""
    name = os.fspath(path)
    with open(name, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                raise HistoryFormatError(name, lineno, "empty line")
            if not line.endswith("\n"):
                # A writer flushes whole lines: this one was cut short.
                try:
                    json.loads(line)
                except ValueError:
                    raise HistoryFormatError(
                        name, lineno, "truncated last line (no newline, not valid JSON)"
                    ) from None
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise HistoryFormatError(name, lineno, f"not JSON: {exc}") from None
            try:
                yield Op.from_json(obj)
            except ValueError as exc:
                raise HistoryFormatError(name, lineno, str(exc)) from None


def read_history(path: str | os.PathLike[str]) -> list[Op]:
    """Every op of a history file, in file order."""
    return list(iter_history(path))


def write_history(path: str | os.PathLike[str], ops: Iterable[Op]) -> None:
    """Write finished ops as a history file (for histories built in memory,
    such as the simulator's).  Refuses to overwrite a file."""
    with open(os.fspath(path), "x", encoding="utf-8", newline="\n") as fh:
        for op in ops:
            fh.write(op.to_line() + "\n")


class HistoryWriter(HistoryRecorder):
    """A recorder that appends each op to a new JSON Lines file and flushes
    it, so that a crashed run leaves every op it recorded (then the history
    has open invokes and is not well formed: the run did not finish).

    ``clock`` gives monotonic nanoseconds (default :func:`time.monotonic_ns`);
    ``time`` 0 is when the writer was made, unless ``start_ns`` is given.
    :meth:`close` completes every op still in flight as ``info`` first.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = time.monotonic_ns,
        start_ns: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._fh: TextIO | None = open(self.path, "x", encoding="utf-8", newline="\n")  # noqa: SIM115
        super().__init__(clock, self._write, start_ns=start_ns, lock=threading.Lock())

    def _write(self, op: Op) -> None:
        if self._fh is None:
            raise HistoryError(f"{self.path} is closed")
        self._fh.write(op.to_line() + "\n")
        self._fh.flush()

    def close(self, error: str = "run-ended") -> None:
        if self._fh is None:
            return
        self.close_open(error)
        self._fh.close()
        self._fh = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

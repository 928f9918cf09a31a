"""The format of the node exports beyond ``log.jsonl`` and ``changes.jsonl``
(``docs/history-format.md``, node exports), as ``kq chaos check`` reads them:

- ``votes.jsonl`` (every node of a real cluster): read by
  :func:`history.votes.read_votes`;
- ``broker_registrations.jsonl`` (each controller of a run with brokers):
  each broker's registration after every record that changed it;
- ``partitions.jsonl`` (each broker): every record of every partition, a
  batch whose CRC fails (a damaged tail a recovery kept after a torn
  power loss) standing at each of its offsets as :data:`DAMAGED_HASH`;
- ``partition_state.jsonl`` (each broker): each partition's checkpointed
  HW, log end, and why the reader stopped (a torn or damaged batch).

Each reader returns the lines as dicts, or raises
:class:`~history.ops.HistoryFormatError` naming the file, the line and the
field at the first line that breaks the format: the checks built on these
files (``vote-durability``, ``ineligible-isr``, ``replica-divergence``)
read them as they are, so a malformed line is said before any check runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from history.ops import HistoryFormatError

__all__ = [
    "BROKER_REGISTRATIONS_FILE",
    "DAMAGED_HASH",
    "PARTITIONS_FILE",
    "PARTITION_STATE_FILE",
    "REGISTRATION_EVENTS",
    "read_partition_records",
    "read_partition_states",
    "read_registrations",
]

BROKER_REGISTRATIONS_FILE: Final = "broker_registrations.jsonl"
PARTITIONS_FILE: Final = "partitions.jsonl"
PARTITION_STATE_FILE: Final = "partition_state.jsonl"

DAMAGED_HASH: Final = "damaged: CRC mismatch"
"""The ``hash`` of each offset of a stored batch whose CRC fails (the
exporter, ``chaos.node_exports``, writes the same text)."""

REGISTRATION_EVENTS: Final = ("register", "fence", "unfence", "change", "unregister", "snapshot")

Row = Mapping[str, Any]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: object) -> bool:
    return _is_int(v) and v >= 0  # type: ignore[operator]


def _counts(obj: Row, *names: str) -> list[str]:
    return [
        f"{name} must be an integer >= 0, got {obj[name]!r}"
        for name in names
        if not _is_count(obj[name])
    ]


def _is_sha256(v: object) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _registration_problems(obj: Row) -> list[str]:
    out = _counts(obj, "node", "offset", "epoch", "broker")
    event = obj["event"]
    if event not in REGISTRATION_EVENTS:
        out.append(f"event must be one of {', '.join(REGISTRATION_EVENTS)}, got {event!r}")
        return out
    after = ("broker_epoch", "fenced", "in_controlled_shutdown")
    if event == "unregister":
        # No registration is left after it.
        out.extend(
            f"{name} must be null after unregister, got {obj[name]!r}"
            for name in after
            if obj[name] is not None
        )
        return out
    out.extend(_counts(obj, "broker_epoch"))
    out.extend(
        f"{name} must be true or false, got {obj[name]!r}"
        for name in after[1:]
        if not isinstance(obj[name], bool)
    )
    return out


def _record_problems(obj: Row) -> list[str]:
    out = _counts(obj, "node", "partition", "offset")
    if not (isinstance(obj["topic"], str) and obj["topic"]):
        out.append(f"topic must be a non-empty string, got {obj['topic']!r}")
    out.extend(
        f"{name} must be an integer, got {obj[name]!r}"
        for name in ("epoch",)
        if not _is_int(obj[name])
    )
    for name in ("producer_id", "sequence"):
        if not (_is_int(obj[name]) and obj[name] >= -1):
            out.append(f"{name} must be an integer >= -1, got {obj[name]!r}")
    if obj["producer_id"] == -1 and obj["sequence"] != -1:
        out.append(f"sequence must be -1 without a producer, got {obj['sequence']!r}")
    if not isinstance(obj["control"], bool):
        out.append(f"control must be true or false, got {obj['control']!r}")
    h = obj["hash"]
    if not (_is_sha256(h) or h == DAMAGED_HASH):
        out.append(
            f"hash must be 64 lowercase hex digits (SHA-256) or {DAMAGED_HASH!r} "
            f"(a batch whose CRC fails), got {h!r}"
        )
    return out


def _state_problems(obj: Row) -> list[str]:
    out = _counts(obj, "node", "partition", "log_end_offset")
    if not (isinstance(obj["topic"], str) and obj["topic"]):
        out.append(f"topic must be a non-empty string, got {obj['topic']!r}")
    hw = obj["high_watermark"]
    if not (_is_int(hw) and hw >= -1):
        out.append(f"high_watermark must be an integer >= -1 (-1: unreadable), got {hw!r}")
    if obj["stopped_at"] is not None and not isinstance(obj["stopped_at"], str):
        out.append(f"stopped_at must be a string or null, got {obj['stopped_at']!r}")
    return out


_FIELDS: Final = {
    BROKER_REGISTRATIONS_FILE: (
        "node",
        "offset",
        "epoch",
        "broker",
        "event",
        "broker_epoch",
        "fenced",
        "in_controlled_shutdown",
    ),
    PARTITIONS_FILE: (
        "node",
        "topic",
        "partition",
        "offset",
        "epoch",
        "producer_id",
        "sequence",
        "control",
        "hash",
    ),
    PARTITION_STATE_FILE: (
        "node",
        "topic",
        "partition",
        "high_watermark",
        "log_end_offset",
        "stopped_at",
    ),
}


def _read(
    path: str | os.PathLike[str],
    fields: tuple[str, ...],
    problems: Callable[[Row], list[str]],
) -> list[dict[str, Any]]:
    name = os.fspath(path)
    out: list[dict[str, Any]] = []
    with open(name, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                obj: Any = json.loads(line)
            except ValueError as exc:
                raise HistoryFormatError(name, lineno, f"not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise HistoryFormatError(name, lineno, "expected a JSON object")
            if set(obj) != set(fields):
                missing = sorted(set(fields) - set(obj))
                unknown = sorted(set(obj) - set(fields))
                raise HistoryFormatError(
                    name, lineno, f"missing field(s) {missing}, unknown field(s) {unknown}"
                )
            found = problems(obj)
            if found:
                raise HistoryFormatError(name, lineno, "; ".join(found))
            out.append(obj)
    return out


def read_registrations(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A controller's ``broker_registrations.jsonl``."""
    return _read(path, _FIELDS[BROKER_REGISTRATIONS_FILE], _registration_problems)


def read_partition_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A broker's ``partitions.jsonl``, damaged batches included."""
    return _read(path, _FIELDS[PARTITIONS_FILE], _record_problems)


def read_partition_states(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A broker's ``partition_state.jsonl``."""
    return _read(path, _FIELDS[PARTITION_STATE_FILE], _state_problems)

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
  HW, log end, and why the reader stopped (a torn or damaged batch);
- ``partition_timeline.jsonl`` (each broker): its partitions' states
  (role, leader, leader epoch, HW, log end, log start, ISR), truncations,
  follower log restarts and removals, from its log lines, in their order;
- ``partition_changes.jsonl`` (each controller of a run with brokers):
  each partition's leader, epochs and ISR after every change it committed,
  in its metadata log's order.

Each reader returns the lines as dicts, or raises
:class:`~history.ops.HistoryFormatError` naming the file, the line and the
field at the first line that breaks the format: the checks built on these
files (``vote-durability``, ``ineligible-isr``, ``replica-divergence``,
``history.partition_checks``) read them as they are, so a malformed line is
said before any check runs.  A field added to an export later
(``log_start_offset`` of the timeline; ``leader_recovery_state`` and
``unclean`` of the changes) may be absent from a line, as the runs exported
before it lack it, but only all of a file's later fields at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from history.export_files import json_objects
from history.ops import HistoryFormatError

__all__ = [
    "BROKER_REGISTRATIONS_FILE",
    "DAMAGED_HASH",
    "LEADER_RECOVERY_STATES",
    "PARTITIONS_FILE",
    "PARTITION_CHANGES_FILE",
    "PARTITION_STATE_FILE",
    "PARTITION_TIMELINE_FILE",
    "REGISTRATION_EVENTS",
    "REPLICA_ROLES",
    "TIMELINE_EVENTS",
    "read_partition_changes",
    "read_partition_records",
    "read_partition_states",
    "read_export_lines",
    "read_partition_timeline",
    "read_registrations",
]

BROKER_REGISTRATIONS_FILE: Final = "broker_registrations.jsonl"
PARTITIONS_FILE: Final = "partitions.jsonl"
PARTITION_STATE_FILE: Final = "partition_state.jsonl"
PARTITION_TIMELINE_FILE: Final = "partition_timeline.jsonl"
PARTITION_CHANGES_FILE: Final = "partition_changes.jsonl"

DAMAGED_HASH: Final = "damaged: CRC mismatch"
"""The ``hash`` of each offset of a stored batch whose CRC fails (the
exporter, ``chaos.node_exports``, writes the same text)."""

REGISTRATION_EVENTS: Final = ("register", "fence", "unfence", "change", "unregister", "snapshot")
TIMELINE_EVENTS: Final = ("state", "truncate", "restart", "removed")
REPLICA_ROLES: Final = ("leader", "follower", "none")
"""A replica's role in a timeline's state line (``server.broker``)."""
LEADER_RECOVERY_STATES: Final = ("recovered", "recovering")
"""KIP-704's ``LeaderRecoveryState``, lower case (``metadata.records``)."""

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
    out.extend(_topic(obj))
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
    out.extend(_topic(obj))
    hw = obj["high_watermark"]
    if not (_is_int(hw) and hw >= -1):
        out.append(f"high_watermark must be an integer >= -1 (-1: unreadable), got {hw!r}")
    if obj["stopped_at"] is not None and not isinstance(obj["stopped_at"], str):
        out.append(f"stopped_at must be a string or null, got {obj['stopped_at']!r}")
    return out


def _topic(obj: Row) -> list[str]:
    topic = obj["topic"]
    return (
        []
        if isinstance(topic, str) and topic
        else [f"topic must be a non-empty string, got {topic!r}"]
    )


def _at_least_minus_one(obj: Row, *names: str, none: str = "none") -> list[str]:
    return [
        f"{name} must be an integer >= -1 (-1: {none}), got {obj[name]!r}"
        for name in names
        if not (_is_int(obj[name]) and obj[name] >= -1)
    ]


def _broker_ids(obj: Row, *names: str) -> list[str]:
    return [
        f"{name} must be a list of broker ids (integers >= 0), got {obj[name]!r}"
        for name in names
        if not (isinstance(obj[name], list) and all(_is_count(b) for b in obj[name]))
    ]


_TIMELINE_FILLED: Final = {
    "state": (
        "leader_epoch",
        "role",
        "leader",
        "high_watermark",
        "log_end_offset",
        "log_start_offset",
        "isr",
    ),
    "truncate": ("leader_epoch", "truncated_from", "truncated_to"),
    # A follower log restarted at its leader's log start: the log end before,
    # and the log's start and end after (the same offset).
    "restart": ("leader_epoch", "truncated_from", "log_start_offset", "log_end_offset"),
    "removed": (),
}
"""The fields each event of a timeline fills; the others are null."""
_TIMELINE_EVENT_FIELDS: Final = tuple(
    dict.fromkeys(_TIMELINE_FILLED["state"] + _TIMELINE_FILLED["truncate"])
)


def _timeline_problems(obj: Row) -> list[str]:
    out = _counts(obj, "node", "life", "time", "partition")
    if not (_is_int(obj["seq"]) and obj["seq"] >= 1):
        out.append(f"seq must be an integer >= 1 (a line number), got {obj['seq']!r}")
    out.extend(_topic(obj))
    event = obj["event"]
    if event not in TIMELINE_EVENTS:
        out.append(f"event must be one of {', '.join(TIMELINE_EVENTS)}, got {event!r}")
        return out
    filled = _TIMELINE_FILLED[event]
    out.extend(
        f"{name} must be null on a {event} line, got {obj.get(name)!r}"
        for name in _TIMELINE_EVENT_FIELDS
        if name not in filled and obj.get(name) is not None
    )
    if event != "removed":
        out.extend(_at_least_minus_one(obj, "leader_epoch", none="none known yet"))
    if event == "state":
        if obj["role"] not in REPLICA_ROLES:
            out.append(f"role must be one of {', '.join(REPLICA_ROLES)}, got {obj['role']!r}")
        out.extend(_at_least_minus_one(obj, "leader"))
        out.extend(_counts(obj, "high_watermark", "log_end_offset"))
        start = obj.get("log_start_offset")
        if start is not None and not _is_count(start):
            out.append(f"log_start_offset must be an integer >= 0 or null, got {start!r}")
        out.extend(_broker_ids(obj, "isr"))
    elif event == "truncate":
        out.extend(_counts(obj, "truncated_from", "truncated_to"))
    elif event == "restart":
        offsets = ("truncated_from", "log_start_offset", "log_end_offset")
        counts = _counts(obj, *offsets)
        out.extend(counts)
        if counts:
            return out
        if obj["log_end_offset"] != obj["log_start_offset"]:
            out.append(
                f"log_end_offset must equal log_start_offset on a restart line (the log "
                f"restarts empty), got {obj['log_end_offset']!r} and {obj['log_start_offset']!r}"
            )
        if obj["log_start_offset"] < obj["truncated_from"]:
            out.append(
                f"log_start_offset must be at least truncated_from on a restart line (a log "
                f"restarts at or past its end), got {obj['log_start_offset']!r} below "
                f"{obj['truncated_from']!r}"
            )
    return out


def _timeline_order(before: Row, obj: Row) -> list[str]:
    # One broker's log text, read in its order: the line numbers rise and
    # a life (a process start) never comes back.
    out = []
    if _is_int(before["seq"]) and _is_int(obj["seq"]) and obj["seq"] <= before["seq"]:
        out.append(f"seq must rise, got {obj['seq']!r} after {before['seq']!r}")
    if _is_int(before["life"]) and _is_int(obj["life"]) and obj["life"] < before["life"]:
        out.append(f"life must not fall, got {obj['life']!r} after {before['life']!r}")
    return out


def _change_problems(obj: Row) -> list[str]:
    out = _counts(obj, "node", "offset", "epoch", "partition", "leader_epoch", "partition_epoch")
    out.extend(_topic(obj))
    out.extend(_at_least_minus_one(obj, "leader"))
    out.extend(_broker_ids(obj, "isr", "elr"))
    if "leader_recovery_state" not in obj:
        return out  # exported before KIP-704's state was
    recovery, unclean = obj["leader_recovery_state"], obj["unclean"]
    if recovery not in LEADER_RECOVERY_STATES:
        out.append(
            f"leader_recovery_state must be one of {', '.join(LEADER_RECOVERY_STATES)}, "
            f"got {recovery!r}"
        )
    if not isinstance(unclean, bool):
        out.append(f"unclean must be true or false, got {unclean!r}")
    elif unclean and recovery != "recovering":
        # An unclean election elects its leader RECOVERING (Kafka's
        # PartitionChangeBuilder), and the line holds the state after it.
        out.append(f"an unclean line must be recovering, got leader_recovery_state {recovery!r}")
    return out


def _change_order(before: Row, obj: Row) -> list[str]:
    # The changes of one metadata log, in its order: one record an offset.
    if _is_int(before["offset"]) and _is_int(obj["offset"]) and obj["offset"] <= before["offset"]:
        return [f"offset must rise, got {obj['offset']!r} after {before['offset']!r}"]
    return []


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
    PARTITION_TIMELINE_FILE: (
        "node",
        "seq",
        "life",
        "time",
        "topic",
        "partition",
        "event",
        *_TIMELINE_EVENT_FIELDS,
    ),
    PARTITION_CHANGES_FILE: (
        "node",
        "offset",
        "epoch",
        "topic",
        "partition",
        "leader",
        "leader_epoch",
        "partition_epoch",
        "isr",
        "elr",
        "leader_recovery_state",
        "unclean",
    ),
}

_LATER: Final = {
    PARTITION_TIMELINE_FILE: ("log_start_offset",),
    PARTITION_CHANGES_FILE: ("leader_recovery_state", "unclean"),
}
"""The fields a file's exporter added later: a line lacks all of them (an
older run's) or none."""


def _read(
    path: str | os.PathLike[str],
    file: str,
    problems: Callable[[Row], list[str]],
    order: Callable[[Row, Row], list[str]] | None = None,
) -> list[dict[str, Any]]:
    """The lines of ``path``, in the format of the export named ``file``
    (:data:`_FIELDS`, :data:`_LATER`)."""
    return read_export_lines(path, _FIELDS[file], problems, order, _LATER.get(file, ()))


def read_export_lines(
    path: str | os.PathLike[str],
    fields: Sequence[str],
    problems: Callable[[Row], list[str]],
    order: Callable[[Row, Row], list[str]] | None = None,
    later: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The lines of a node export at ``path``, each a JSON object with
    exactly ``fields`` (less all of ``later`` on a line of an older
    export), none of whose ``problems`` nor, from the second line on, of
    its ``order`` after the line before, is found; else
    :class:`HistoryFormatError` names the first line that breaks them."""
    full = set(fields)
    older = full - set(later)
    out: list[dict[str, Any]] = []
    for name, lineno, obj in json_objects(path):
        if set(obj) != full and set(obj) != older:
            missing = sorted(full - set(obj))
            unknown = sorted(set(obj) - full)
            raise HistoryFormatError(
                name, lineno, f"missing field(s) {missing}, unknown field(s) {unknown}"
            )
        found = problems(obj)
        if order is not None and out:
            found.extend(order(out[-1], obj))
        if found:
            raise HistoryFormatError(name, lineno, "; ".join(found))
        out.append(obj)
    return out


def read_registrations(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A controller's ``broker_registrations.jsonl``."""
    return _read(path, BROKER_REGISTRATIONS_FILE, _registration_problems)


def read_partition_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A broker's ``partitions.jsonl``, damaged batches included."""
    return _read(path, PARTITIONS_FILE, _record_problems)


def read_partition_states(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A broker's ``partition_state.jsonl``."""
    return _read(path, PARTITION_STATE_FILE, _state_problems)


def read_partition_timeline(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A broker's ``partition_timeline.jsonl``."""
    return _read(path, PARTITION_TIMELINE_FILE, _timeline_problems, _timeline_order)


def read_partition_changes(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A controller's ``partition_changes.jsonl``."""
    return _read(path, PARTITION_CHANGES_FILE, _change_problems, _change_order)

"""One well-formed line of each newer node export (``docs/history-format.md``,
node exports), for the tests of their format (``test_export_formats``) and
of ``kq chaos check`` (``tests/chaos/test_runs``) to change one field of."""

from __future__ import annotations

from typing import Any

SHA = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"
"""SHA-256 of ``1``: the record of the queue workload's value 1."""

REGISTRATION: dict[str, Any] = {
    "node": 1,
    "offset": 12,
    "epoch": 2,
    "broker": 4,
    "event": "register",
    "broker_epoch": 12,
    "fenced": True,
    "in_controlled_shutdown": False,
}
RECORD: dict[str, Any] = {
    "node": 5,
    "topic": "queue",
    "partition": 0,
    "offset": 0,
    "epoch": 0,
    "producer_id": 1000,
    "sequence": 0,
    "control": False,
    "hash": SHA,
}
STATE: dict[str, Any] = {
    "node": 5,
    "topic": "queue",
    "partition": 0,
    "high_watermark": 3,
    "log_end_offset": 3,
    "stopped_at": None,
}

STATE_LINE: dict[str, Any] = {
    "node": 4,
    "seq": 212,
    "life": 0,
    "time": 12_901_000_000,
    "topic": "queue",
    "partition": 0,
    "event": "state",
    "leader_epoch": 1,
    "role": "follower",
    "leader": 5,
    "high_watermark": 17,
    "log_end_offset": 19,
    "log_start_offset": 0,
    "isr": [4, 5, 6],
    "truncated_from": None,
    "truncated_to": None,
}
TRUNCATE_LINE: dict[str, Any] = STATE_LINE | {
    "seq": 215,
    "time": 13_020_000_000,
    "event": "truncate",
    "leader_epoch": 2,
    "role": None,
    "leader": None,
    "high_watermark": None,
    "log_end_offset": None,
    "log_start_offset": None,
    "isr": None,
    "truncated_from": 19,
    "truncated_to": 17,
}
RESTART_LINE: dict[str, Any] = TRUNCATE_LINE | {
    "seq": 220,
    "event": "restart",
    "log_start_offset": 40,
    "log_end_offset": 40,
    "truncated_from": 19,
    "truncated_to": None,
}
REMOVED_LINE: dict[str, Any] = TRUNCATE_LINE | {
    "seq": 230,
    "event": "removed",
    "leader_epoch": None,
    "truncated_from": None,
    "truncated_to": None,
}
CHANGE: dict[str, Any] = {
    "node": 1,
    "offset": 41,
    "epoch": 2,
    "topic": "queue",
    "partition": 0,
    "leader": 5,
    "leader_epoch": 0,
    "partition_epoch": 0,
    "isr": [5, 4, 6],
    "elr": [],
    "leader_recovery_state": "recovered",
    "unclean": False,
}

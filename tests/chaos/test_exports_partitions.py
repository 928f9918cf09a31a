"""The brokers' partition timeline export: the state, truncation, restart
and removal lines a broker logs (``server.broker``), read back by
``chaos.node_exports.partition_timeline``, one life per process start."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from pathlib import Path

from chaos.node_exports import PARTITION_TIMELINE_FILE, export_broker, partition_timeline
from history.partition_checks import check_partitions, read_partition_exports
from history.runs import RunDir
from kq.commands.controller import LOG_FORMAT


def _stamp_ns(text: str) -> int:
    when = datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")
    return int(time.mktime(when.timetuple())) * 10**9 + when.microsecond * 1000


def _line(stamp: str, message: str, name: str = "kq.broker") -> str:
    # Formatted as the brokers' handlers format their records.
    record = logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)
    record.created = _stamp_ns(stamp) / 1e9
    record.msecs = int(stamp[-3:])
    formatter = logging.Formatter(LOG_FORMAT)
    formatter.converter = lambda *_: datetime.strptime(stamp[:-4], "%Y-%m-%d %H:%M:%S").timetuple()
    return formatter.format(record)


LOG = "\n".join(
    [
        _line("2026-11-26 07:00:00,000", "broker 4 samples its partitions every 250 ms"),
        _line(
            "2026-11-26 07:00:00,250",
            "broker 4 partition queue-0: role leader leader 4 epoch 0 hw 0 leo 0 isr 4,5,6",
        ),
        _line(
            "2026-11-26 07:00:00,500",
            "broker 5 partition queue-0: role follower leader 4 epoch 0 hw 0 leo 0 isr 4,5,6",
        ),
        _line("2026-11-26 07:00:00,750", "broker 4: fetching from broker 5 at x: unavailable"),
        _line(
            "2026-11-26 07:00:01,000",
            "broker 4 partition my-topic-12: role follower leader 6 epoch 3 hw 7 leo 9 start 2"
            " isr ",
        ),
        _line(
            "2026-11-26 07:00:01,250",
            "broker 4 partition my-topic-12 truncated from 9 to 7 in epoch 3",
        ),
        _line("2026-11-26 07:00:01,500", "broker 4 partition my-topic-12 removed"),
        _line("2026-11-26 07:00:02,000", "broker 4 samples its partitions every 250 ms"),
        _line(
            "2026-11-26 07:00:02,250",
            "broker 4 partition queue-0: role none leader -1 epoch -1 hw 0 leo 3 isr ",
        ),
    ]
)


def test_the_state_truncation_and_removal_lines_read_back() -> None:
    start = _stamp_ns("2026-11-26 07:00:00,000")
    rows = partition_timeline(4, LOG, start)
    assert [(r["seq"], r["life"], r["event"], r["topic"], r["partition"]) for r in rows] == [
        (2, 0, "state", "queue", 0),
        (5, 0, "state", "my-topic", 12),
        (6, 0, "truncate", "my-topic", 12),
        (7, 0, "removed", "my-topic", 12),
        (9, 1, "state", "queue", 0),
    ]
    first, follower, cut, gone, later = rows
    assert first["time"] == 250_000_000 and first["node"] == 4
    assert (first["role"], first["leader"], first["leader_epoch"]) == ("leader", 4, 0)
    assert (first["high_watermark"], first["log_end_offset"], first["isr"]) == (0, 0, [4, 5, 6])
    assert follower["isr"] == [] and follower["high_watermark"] == 7
    # The log start offset, from brokers that log it (older lines have none).
    assert follower["log_start_offset"] == 2 and first["log_start_offset"] is None
    assert cut["log_start_offset"] is None
    assert (cut["truncated_from"], cut["truncated_to"], cut["leader_epoch"]) == (9, 7, 3)
    assert cut["high_watermark"] is None and gone["leader_epoch"] is None
    assert (later["leader"], later["leader_epoch"], later["time"]) == (-1, -1, 2_250_000_000)
    # A line of another broker is not this one's; times never go below 0.
    assert partition_timeline(5, LOG, start)[0]["role"] == "follower"
    assert partition_timeline(4, LOG, start + 10**12)[0]["time"] == 0


def test_export_broker_writes_the_timeline_the_checks_read(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    export_broker(run, 4, LOG, [tmp_path / "no-logs"], _stamp_ns("2026-11-26 07:00:00,000"))
    lines = (run.node_dir(4) / PARTITION_TIMELINE_FILE).read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["event"] == "state"
    exports = read_partition_exports(tmp_path)
    assert len(exports.timeline) == 5
    # The truncation from 9 to 7 is not below the follower's own HW 7.
    assert not any(check_partitions(exports).values())
    # Without a start, times count from the log's first line.
    other = RunDir(tmp_path / "other")
    export_broker(other, 4, LOG, [])
    first = json.loads((other.node_dir(4) / PARTITION_TIMELINE_FILE).read_text().splitlines()[0])
    assert first["time"] == 250_000_000


# A follower of queue-1 at HW 7 whose leader's log starts at 40: its log
# restarts there, its HW rises to 40, and it catches up.
RESTART_LOG = "\n".join(
    [
        _line("2026-11-26 07:00:00,000", "broker 4 samples its partitions every 250 ms"),
        _line(
            "2026-11-26 07:00:00,250",
            "broker 4 partition queue-1: role follower leader 5 epoch 3 hw 7 leo 9 start 2 isr 5,6",
        ),
        _line(
            "2026-11-26 07:00:00,500",
            "broker 4 partition queue-1 restarted at 40 from [2, 9) in epoch 3",
        ),
        _line(
            "2026-11-26 07:00:00,750",
            "broker 4 partition queue-1: role follower leader 5 epoch 3 hw 40 leo 40 start 40"
            " isr 5,6",
        ),
        _line(
            "2026-11-26 07:00:01,000",
            "broker 4 partition queue-1: role follower leader 5 epoch 3 hw 52 leo 52 start 40"
            " isr 4,5,6",
        ),
    ]
)


def test_a_restart_line_reads_back_apart_from_a_truncation(tmp_path: Path) -> None:
    rows = partition_timeline(4, RESTART_LOG, _stamp_ns("2026-11-26 07:00:00,000"))
    assert [r["event"] for r in rows] == ["state", "restart", "state", "state"]
    restart = rows[1]
    assert (restart["seq"], restart["leader_epoch"], restart["truncated_from"]) == (3, 3, 9)
    assert (restart["log_start_offset"], restart["log_end_offset"]) == (40, 40)
    assert restart["truncated_to"] is None and restart["high_watermark"] is None
    run = RunDir(tmp_path)
    export_broker(run, 4, RESTART_LOG, [], _stamp_ns("2026-11-26 07:00:00,000"))
    exports = read_partition_exports(tmp_path)
    # No partition check fires: the records dropped lay below the leader's
    # log start, and the HW only rose (read as a truncation from 9 to the
    # old start 2, it would be one below the committed HW 7).
    assert [r["event"] for r in exports.timeline] == ["state", "restart", "state", "state"]
    assert not any(check_partitions(exports).values())

"""The process that test_crash_files.py kills with SIGKILL: it opens (and so
recovers) a partition log on real files and appends batches as leader until
it is killed, writing one line per batch to stdout once the append has
returned: ``<first offset> <last offset> <the batch's bytes as the log holds
them, in hex>``.  Its first line says how the open went.

Usage: crash_child.py DIRECTORY ROUND FLUSH_MESSAGES (0: no flush policy)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from partition_log.batch import build_batch, set_base_offset, set_leader_epoch
from partition_log.log import LogConfig, PartitionLog
from partition_log.os_files import OsDirectory
from partition_log.records import Record

PRODUCER_ID = 7


def config(flush_messages: int) -> LogConfig:
    """Small segments, so the log rolls every few batches."""
    return LogConfig(
        segment_bytes=2048,
        index_interval_bytes=256,
        flush_messages=flush_messages or None,
    )


def main(argv: list[str]) -> None:
    path, round_number, flush_messages = argv[0], int(argv[1]), int(argv[2])
    log = PartitionLog.open(OsDirectory(path), config(flush_messages), now_ms=round_number)
    recovery = log.recovery
    opened = {
        "clean": recovery.clean,
        "end": log.log_end_offset,
        "cut_segment": recovery.cut_segment,
        "truncated_bytes": recovery.truncated_bytes,
    }
    out = sys.stdout
    out.write(f"opened {json.dumps(opened)}\n")
    out.flush()
    # One leader epoch and one producer epoch per round, so every round
    # adds an epoch to the cache and starts its producer's sequences at 0.
    epoch = round_number + 1
    sequence = 0
    while True:
        count = 1 + sequence % 4
        records = [
            Record(i, 1000 + sequence, b"k%d" % (sequence % 10), b"round %d seq %d" % (epoch, i))
            for i in range(count)
        ]
        data = bytearray(
            build_batch(
                records,
                producer_id=PRODUCER_ID,
                producer_epoch=round_number,
                base_sequence=sequence,
            )
        )
        info = log.append_as_leader(bytes(data), epoch, 1000 + sequence)
        set_base_offset(data, info.first_offset)
        set_leader_epoch(data, epoch)
        out.write(f"{info.first_offset} {info.last_offset} {data.hex()}\n")
        out.flush()
        sequence += count


if __name__ == "__main__":
    main(sys.argv[1:])
